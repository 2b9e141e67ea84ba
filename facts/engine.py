"""A release's lock as one host holds it, read to install the same set on another host."""

from __future__ import annotations

import base64
import binascii
import shlex

from pyinfra.api.facts import FactBase


class LockFile(FactBase[str | None]):
    """The exact text of a lock file on the host; None when it is absent or unreadable.

    .. code:: python

        "# platform: cp311-x86_64\\n# index: https://pypi.org/simple\\nvllm==0.34.0 \\\\\\n    --hash=sha256:...\\n"
    """

    def command(self, path: str) -> str:
        # base64 on one line: the text comes back byte for byte (its digest is checked).
        return f"base64 -w0 {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        data = "".join(output).strip()
        try:
            return base64.b64decode(data, validate=True).decode("utf-8") if data else None
        except (binascii.Error, UnicodeDecodeError):
            return None
