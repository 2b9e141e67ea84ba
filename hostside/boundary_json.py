"""JSON that comes from outside the controller's own recipe, decoded within bounds.

Peers' lines (the comm check) and the host probes' answers: ``loads`` refuses, with one
``ValueError`` line that starts with ``where`` and names the rule, a text over ``max_bytes``, one
nested deeper than ``max_depth`` (measured before decoding, so a deep text never reaches Python's
recursive decoder and its ``RecursionError``), a text that is not strict JSON (``NaN`` and
``Infinity`` included) and an integer Python will not convert (over 4,300 digits). It never
shows the text itself. Stdlib only: the controller and the host programs run this same code.
"""

from __future__ import annotations

import json
import re
import sys
from itertools import accumulate
from typing import Any

DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32

# A JSON string (escapes included), to blank out before counting brackets: a "[" inside a string
# is text, not nesting.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def depth(data: bytes) -> int:
    """How deeply ``data``'s arrays and objects nest (0 for a scalar); linear, no recursion."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes | str, where: str, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """The value ``data`` holds, or ``ValueError("<where>: <rule>")``; see the module's docstring."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise ValueError(f"{where}: {len(raw)} bytes of JSON, over the limit of {max_bytes}")
    # Cheap first: a text with no more brackets than the limit cannot nest deeper than it.
    if raw.count(b"[") + raw.count(b"{") > max_depth and depth(raw) > max_depth:
        raise ValueError(f"{where}: JSON nested deeper than {max_depth} levels")
    try:
        return json.loads(data, parse_constant=_constant)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and the int digit limit included
        reason = " ".join(str(exc).split())
        if reason.startswith("Exceeds the limit"):
            reason = f"an integer over {sys.get_int_max_str_digits()} digits"
        raise ValueError(f"{where}: not JSON: {reason}") from None
