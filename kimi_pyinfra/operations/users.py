"""The unprivileged system user engines run as."""

from __future__ import annotations

import shlex
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside.host_dirs import STATE_DIR


@operation()
def system_user(user: str, exists: bool) -> Generator[str, None, None]:
    """
    Ensure a system user with no login shell and no home outside the deploy's state folder (``/var/lib/kimi``).

    + user: the user (and its group)
    + exists: whether the probe found it
    """
    if exists:
        host.noop(f"user {user} exists")
        return
    q = shlex.quote
    yield f"useradd --system --user-group --home-dir {STATE_DIR} --no-create-home --shell /usr/sbin/nologin {q(user)}"
