"""A host's progress file as the controller reads it (``hostside/progress_file.py`` writes it).

What a host sends is another host's word: anything but the one line of three ASCII integers, each
of a sane size, with the bytes done no more than the bytes in all, reads as no progress at all
(None), never as an error: progress is for show, and a step goes on whatever a host says of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kimi_deploy.hostside.progress_file import MAX_BYTES

# At most an exabyte; the time at most 12 digits (the year 33658).
_LINE = re.compile(r"([0-9]{1,19}) ([0-9]{1,19}) ([0-9]{1,12})\n?", re.ASCII)
MOST_BYTES = 10**18


@dataclass(frozen=True)
class Reading:
    """``done`` of ``total`` bytes, as the host wrote them at ``time`` (its clock, seconds since
    the epoch)."""

    done: int
    total: int
    time: int


def parse_progress(text: str) -> Reading | None:
    """The reading in a progress file's text, or None when it is not one."""
    if len(text) > MAX_BYTES:
        return None
    line = _LINE.fullmatch(text)
    if line is None:
        return None
    done, total, when = (int(n) for n in line.groups())
    if total > MOST_BYTES or done > total:
        return None
    return Reading(done, total, when)
