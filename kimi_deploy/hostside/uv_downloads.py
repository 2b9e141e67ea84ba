"""The bytes of a release's wheels, as uv says it fetches them: a release install's progress.

uv names each download over 1 MiB, when stderr is not a terminal too, as it starts and as it
ends (uv 0.5.27 on; the releases' uv is pinned in the recipe):

    Downloading torch (846.9MiB)
     Downloaded torch

``Downloads`` sums them: the bytes in all are those of every download started so far (uv starts
them at once, up to its concurrency), the bytes done those of every download ended. Smaller
wheels are not named and count for nothing: a release of gigabytes is a few large wheels. A line
of another shape is not a download and changes nothing.
"""

from __future__ import annotations

import re

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
# a project name (PEP 508's characters) and a size as uv prints it; anchored, bounded: no backtracking
_NAME = r"([A-Za-z0-9][A-Za-z0-9._-]{0,199})"
_STARTED = re.compile(rf"Downloading {_NAME} \(([0-9]{{1,6}}(?:\.[0-9]{{1,3}})?)(B|KiB|MiB|GiB|TiB)\)")
_ENDED = re.compile(rf"Downloaded {_NAME}")
_LINE_MAX = 512


class Downloads:
    """The downloads uv named so far: ``total`` bytes started, ``done`` bytes ended."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.ended: set[str] = set()

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    @property
    def done(self) -> int:
        return sum(self.sizes[name] for name in self.ended)

    def line(self, text: str) -> bool:
        """Read one line of uv's stderr; whether it changed the sums."""
        text = text.strip()
        if len(text) > _LINE_MAX:
            return False
        started = _STARTED.fullmatch(text)
        if started is not None:
            name = started.group(1)
            size = int(float(started.group(2)) * _UNITS[started.group(3)])
            if name in self.sizes:
                return False
            self.sizes[name] = size
            return True
        ended = _ENDED.fullmatch(text)
        if ended is not None and ended.group(1) in self.sizes and ended.group(1) not in self.ended:
            self.ended.add(ended.group(1))
            return True
        return False
