"""Preflight: stop a host whose hardware is not what its plan needs, before anything changes."""

from __future__ import annotations

import shlex
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host


@operation()
def passed(failures: list[str], what: str = "preflight") -> Generator[str, None, None]:
    """
    Let the host go on only when every preflight gate passed.

    + failures: the failed gates' lines (``kimi_deploy.preflight.check``)
    + what: the word each line starts with (``preflight``; ``rollback`` for a rollback's checks)

    A failure fails this host here, as its first operation: nothing on it changes, and the other
    hosts go on.
    """
    if not failures:
        host.noop("every preflight gate passes")
        return
    lines = " ".join(shlex.quote(f"kimi-deploy: {what}: {line}") for line in failures)
    yield f"printf '%s\\n' {lines} >&2; exit 1"
