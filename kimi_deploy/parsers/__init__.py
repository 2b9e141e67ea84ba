"""Pure parsers of hardware command outputs: text in, plain JSON-able data out.

One module per output kind (``nvidia_smi_query`` with its field table ``nvidia_smi_fields``,
``nvidia_smi_topo``, ``nvidia_smi_fabric``, ``ibv_devinfo``, ``ibstat``, ``tpu_pci``,
``nccl_tests``). They import nothing but the standard library, do no I/O and never run a command:
the facts that run the commands on a host hand their output here. Each returns what it found or
raises one line saying what it expected and what it saw; "found nothing" is an answer only for a
valid empty output of its command.

Every parser raises only :class:`ParseError` (or a subclass) for input it cannot make sense of; any
other exception escaping a parser is a bug. Outputs come from hosts, so a crafted one must not stall
the controller: no pattern may backtrack over a line (split by hand where one would), and numbers
are read with :func:`read_int`.
"""

from __future__ import annotations

from typing import Any

# No count, size, id or address a hardware tool prints is longer (2**64 has 20 digits).
MAX_DIGITS = 20
_MAX_MESSAGE = 400


class ParseError(ValueError):
    """The text is not the output the parser reads; ``str(error)`` is one line saying what is wrong."""

    def __init__(self, message: str) -> None:
        # One line whatever the input held: a quoted line of output can carry tabs or a CR; and a
        # bounded one, keeping where it starts and the rule it ends with, whatever a line's length.
        text = " ".join(message.split())
        if len(text) > _MAX_MESSAGE:
            text = text[: _MAX_MESSAGE // 2] + " ... " + text[-_MAX_MESSAGE // 2 :]
        super().__init__(text)


def read_int(digits: str, where: str) -> int:
    """``digits`` (a number a parser's pattern matched, sign included) as an int; ``ParseError``
    past :data:`MAX_DIGITS` digits, which ``int`` would refuse past 4300 with a ValueError."""
    if len(digits.lstrip("+-")) > MAX_DIGITS:
        raise ParseError(f"{where}: a number of {len(digits)} digits, longer than any a hardware tool prints")
    return int(digits)


def text_of(value: Any) -> str | None:
    """A text a host reported, or None for anything that is not a string."""
    return value if isinstance(value, str) else None


def count_of(value: Any) -> int | None:
    """A non-negative count a host reported, as an int or as digits; None for anything else."""
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) <= MAX_DIGITS:
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MAX_DIGITS:
        return value
    return None
