"""Preflight: stop a host whose hardware is not what its plan needs, before anything changes."""

from __future__ import annotations

import shlex
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside.boundary_text import printable


@operation()
def passed(failures: list[str], what: str = "preflight") -> Generator[str, None, None]:
    """
    Let the host go on only when every preflight gate passed.

    + failures: the failed gates' lines (``kimi_deploy.host.preflight.check``)
    + what: the word each line starts with (``preflight``; ``rollback`` for a rollback's checks)

    A failure fails this host here, as its first operation: nothing on it changes, and the other
    hosts go on.
    """
    if not failures:
        host.noop("every preflight gate passes")
        return
    # A line may carry what a host reported (a GPU's name, a driver's error, a release's name):
    # the operator's terminal shows it, and acts on none of its escape sequences.
    lines = " ".join(shlex.quote(printable(f"kimi-deploy: {what}: {line}")) for line in failures)
    yield f"printf '%s\\n' {lines} >&2; exit 1"
