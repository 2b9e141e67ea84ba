"""Pure parsers of hardware command outputs: text in, plain JSON-able data out.

One module per output kind (``nvidia_smi_query``, ``nvidia_smi_topo``, ``ibv_devinfo``, ``ibstat``,
``tpu_pci``). They import nothing but the standard library, do no I/O and never run a command: the
facts that run the commands on a host hand their output here.

Every parser raises only :class:`ParseError` (or a subclass) for input it cannot make sense of; any
other exception escaping a parser is a bug.
"""

from __future__ import annotations


class ParseError(ValueError):
    """The text is not the output the parser reads; ``str(error)`` is one line saying what is wrong."""

    def __init__(self, message: str) -> None:
        # One line whatever the input held: a quoted line of output can carry tabs or a CR.
        super().__init__(" ".join(message.split()))
