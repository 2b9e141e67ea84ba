"""Which journals ``kimi-deploy logs`` reads on which hosts, checked against the plan, and the
``journalctl`` command line that reads them.

A host named must be one the plan places, and a unit named one of that host's units (the engine,
its gateway or router, the watchdog: what the converge starts there); each refusal is one line
naming the inventory, the host and what it has instead. Every word of the command line is quoted.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from kimi_deploy.errors import ConfigError

# how many of a list a refusal names before it says how many more
_NAMED = 8


def _listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return ", ".join(names[:_NAMED]) + more


def journal_targets(
    source: str, units: Mapping[str, Sequence[str]], host: str | None = None, unit: str | None = None
) -> dict[str, list[str]]:
    """The units whose journals to read, by host: every host's of ``units`` (each planned host's
    units, in inventory order), or ``host``'s alone, or its ``unit`` alone (``NAME`` or
    ``NAME.service``). ``ConfigError`` naming ``source`` (the inventory) when ``host`` is not a
    host of the plan or ``unit`` not one of its units."""
    if host is None:
        return {name: list(names) for name, names in units.items()}
    if host not in units:
        raise ConfigError(source, f"host {host}", f"not a host of the plan: expected one of {_listed(list(units))}")
    if unit is None:
        return {host: list(units[host])}
    name = unit.removesuffix(".service")
    if name not in units[host]:
        raise ConfigError(
            source, f"host {host}", f"no unit {unit} of the plan there: expected one of {_listed(units[host])}"
        )
    return {host: [name]}


def journal_command(units: Sequence[str], lines: int, follow: bool) -> str:
    """The shell line that prints the last ``lines`` lines of ``units``' journals, merged in time
    order, and with ``follow`` every line after them as they come."""
    words = ["journalctl", "--no-pager", "--output=short-iso", f"--lines={lines}"]
    if follow:
        words.append("--follow")
    words += [f"--unit={name}" for name in units]
    return shlex.join(words)
