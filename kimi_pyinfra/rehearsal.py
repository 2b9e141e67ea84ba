"""A converged host costs its probe and nothing else: a host's steps are rehearsed before any of
them becomes an operation, and only a host with something to change adds them.

pyinfra makes an operation of every call, on every host that makes it, and pays for each
host x operation pair twice: when the deploy file calls it (its order is read from the Python
stack) and when it runs (a greenlet per host, a barrier per operation). A deploy writes its steps
as one function of ``do`` and hands it to ``converge_host``: ``do(op, name=..., **arguments)``
first only runs the operation's own body (``op._inner``) with the arguments it would get, the
way pyinfra itself runs it to find what would change, and notes whether it yields a command.
When no step would, the host is converged and adds no operation at all; when one would, the
steps run again with ``do`` calling the operations, every one of them, so that the host takes
every step of the deploy in order as before (pyinfra orders a run's operations across hosts from
each host's own sequence: a host with some changes keeps every step a barrier).

A step whose body raises is counted as a change: the operation then raises at its usual time,
failing this host as it always did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from pyinfra import logger
from pyinfra.context import host, state

from kimi_pyinfra.fleet_progress import listed
from kimi_pyinfra.run_context import run_context


class Do(Protocol):
    def __call__(self, op: Any, /, **arguments: Any) -> Any: ...


def perform(op: Any, /, **arguments: Any) -> Any:
    """Make the operation (the second pass, or a deploy that does not rehearse)."""
    return op(**arguments)


class Rehearsal:
    """The first pass: the name of the first step that would change something, if any."""

    def __init__(self) -> None:
        self.changes: str | None = None

    def __call__(self, op: Any, /, **arguments: Any) -> None:
        if self.changes is not None:
            return
        body = {k: v for k, v in arguments.items() if k != "name" and not k.startswith("_")}
        name = str(arguments.get("name") or getattr(op, "__name__", op))
        commands = op._inner(**body)
        try:
            if next(iter(commands), None) is not None:
                self.changes = name
        except Exception:  # noqa: BLE001 - the operation raises it again, in its own place
            self.changes = name
        finally:
            commands.close()


def converge_host(steps: Callable[[Do], None]) -> bool:
    """Run ``steps`` as operations only if one of them would change this host; whether it did.
    Once every host of the run has been rehearsed, one line says how many have steps to take."""
    rehearsal = Rehearsal()
    steps(rehearsal)
    if rehearsal.changes is None:
        host.log("converged, no step to take")
    else:
        steps(perform)
    rehearsed = run_context().rehearsed
    rehearsed[host.name] = rehearsal.changes is not None
    if len(rehearsed) == len(state.active_hosts):
        changing = sorted(name for name, changes in rehearsed.items() if changes)
        logger.info(
            f"--> {len(rehearsed)} hosts: {len(rehearsed) - len(changing)} converged (no step to take), "
            f"{len(changing)} with steps to take{': ' + listed(changing) if changing else ''}"
        )
    return rehearsal.changes is not None
