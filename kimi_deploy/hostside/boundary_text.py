"""How every boundary check speaks of what it refuses: the control characters it finds, and values
shown bounded.

A refused value came from outside (a Hub listing, a peer's text, a client's request, a recipe a
user typed): its message shows only a bounded part of it, read without building its whole
``repr`` (a YAML alias bomb shares its items a billion times over; ``repr`` of an int past 4,300
digits raises), and in ASCII, so no control or bidirectional character reaches a terminal or a log.
Stdlib only: the host programs run this code bundled, the controller imports it.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any

# Every character str.splitlines() breaks on is among these: C0, DEL, C1, and the Unicode line and
# paragraph separators.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


# What a terminal acts on rather than shows: the controls above (ESC, which starts every escape
# sequence, among them) and the bidirectional marks, embeddings, overrides and isolates, which
# reorder what follows them on screen.
UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` as a terminal or a log may show it, on one line: each character of ``UNSHOWN``
    written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``), every other one unchanged. An
    escape sequence so shows as text and does nothing."""
    return UNSHOWN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def control_char(text: str) -> str | None:
    """``"U+000A"`` for the first control character of ``text``, None when it holds none."""
    found = CONTROL.search(text)
    return f"U+{ord(found.group()):04X}" if found else None


class _BoundedRepr(reprlib.Repr):
    """``repr`` that reads a bounded part of any value: a few levels, items and characters."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 2
        self.maxstring = self.maxother = self.maxlong = 60
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 6

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:  # over 60 digits: say how many rather than write them
            return f"<an integer of about {x.bit_length() * 30103 // 100000 + 1} digits>"
        return super().repr_int(x, level)


_BOUNDED = _BoundedRepr()


def shown(value: Any, limit: int = 120) -> str:
    """A value as a message shows it: its ``repr``, ASCII only, about ``limit`` characters at most,
    whatever the value's size (only a bounded part of it is read). A long string shows its start
    and its length."""
    if isinstance(value, str):
        if len(value) > limit:
            return f"{_ascii(repr(value[:limit]))}... ({len(value)} characters)"
        text = _ascii(repr(value))
    else:
        text = _ascii(_BOUNDED.repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ascii(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode("ascii")


def error_line(exc: BaseException, limit: int) -> str:
    """An unexpected error of a host program's own, as its one line shows it: the exception's type
    and its first ``limit`` characters, whitespace flattened, ASCII only."""
    said = _ascii(" ".join(str(exc).split())[:limit])
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
