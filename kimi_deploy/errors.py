"""The one error type users see: one line naming where, what, the rule, and what was found."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad input, reported as ``WHERE: FIELD: MESSAGE`` on a single line.

    ``where`` is a file (``recipes/kimi-k3.1-pro.yaml``) or a file plus a host
    (``inventories/prod.py: host gpu-07``); ``field`` is a dotted path into it,
    empty when the whole thing is at fault. The CLI prints ``str(error)`` and exits 2.
    """

    def __init__(self, where: str, field: str, message: str) -> None:
        # One line whatever the input held: keys and values can carry line breaks.
        self.where = " ".join(where.split())
        self.field = " ".join(field.split())
        self.message = " ".join(message.split())
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [p for p in (self.where, self.field, self.message) if p]
        return ": ".join(parts)
