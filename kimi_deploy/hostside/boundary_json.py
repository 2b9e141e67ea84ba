"""JSON that comes from outside the controller's own recipe, decoded within bounds.

Peers' lines (the comm check) and the host probes' answers: ``loads`` refuses, with one
``ValueError`` line that starts with ``where`` and names the rule, a text over ``max_bytes``, one
nested deeper than ``max_depth`` (measured before decoding, in time linear in the text whatever it
holds, so a deep text never reaches Python's recursive decoder and its ``RecursionError``), a
text that is not strict JSON (``NaN`` and ``Infinity`` included) and an integer Python will not
convert (over 4,300 digits). It never shows the text itself. Stdlib only: the controller and the
host programs run this same code.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import accumulate
from typing import Any

DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32

# A string once its escapes are gone. The closing quote is optional: every quote starts a match that
# runs to the next quote or the end, so the text is read once, whatever it holds.
_STRING = re.compile(r'"[^"]*"?')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _text(data: bytes) -> str:
    """``data`` decoded as ``json.loads`` decodes bytes (UTF-8, -16 or -32, told by its first bytes):
    the depth is measured on the characters the decoder reads, not on bytes, where a UTF-16
    character can hold a quote's byte."""
    return data.decode(json.detect_encoding(data), "surrogatepass")


def depth(data: bytes | str) -> int:
    """How deeply ``data``'s arrays and objects nest (0 for a scalar), brackets inside strings not
    counted; in time linear in its length, without recursion. For a text that is not JSON, at least
    the depth the decoder reaches before it finds the fault. Bytes are decoded as ``json.loads``
    decodes them (``UnicodeDecodeError`` when they cannot be)."""
    text = _text(data) if isinstance(data, bytes) else data
    # Escapes first, left to right as the decoder reads them: escaped backslashes in pairs, then an
    # escaped quote. Outside a string a backslash is a fault the decoder stops at, so what follows
    # it cannot matter.
    text = text.replace("\\\\", "").replace('\\"', "")
    # Two quotes side by side (an empty string, or a string's end and the next one's start) leave
    # every other character inside or outside a string as it was: gone, they cost the scan nothing.
    text = _STRING.sub("", text.replace('""', ""))
    # UTF-8 keeps every bracket one byte, and no other character holds a bracket's byte.
    brackets = text.encode("utf-8", "surrogatepass").translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str, where: str, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """The value ``data`` holds, or ``ValueError("<where>: <rule>")``; see the module's docstring."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise ValueError(f"{where}: {len(raw)} bytes of JSON, over the limit of {max_bytes}")
    try:
        text = data if isinstance(data, str) else _text(raw)
    except UnicodeDecodeError as exc:  # one byte's code and place, never the text
        raise ValueError(f"{where}: not JSON: {' '.join(str(exc).split())}") from None
    # Cheap first: a text with no more brackets than the limit cannot nest deeper than it.
    if text.count("[") + text.count("{") > max_depth and depth(text) > max_depth:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_constant)
    except ValueError as exc:  # JSONDecodeError and the int digit limit included
        reason = " ".join(str(exc).split())
        if reason.startswith("Exceeds the limit"):
            reason = f"an integer over {sys.get_int_max_str_digits()} digits"
        raise ValueError(f"{where}: not JSON: {reason}") from None
