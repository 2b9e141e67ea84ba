"""Debian packages from the host's own archive (the gateway's nginx), installed once."""

from __future__ import annotations

import shlex
from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host


@operation()
def debian(packages: list[str], masked: list[str], installed: dict[str, bool]) -> Generator[str, None, None]:
    """
    Install ``packages`` with apt when the probe found any missing, after masking ``masked``.

    A package's post-install script starts its service unless the unit is masked (Debian's
    deb-systemd-invoke skips masked units), so Debian's own nginx.service is masked first: the
    deploy's unit is the only nginx, and nothing listens on port 80.

    + packages: the Debian packages
    + masked: units masked before the install (links to /dev/null in /etc/systemd/system)
    + installed: package -> installed, as the probe found
    """
    missing = [name for name in packages if not installed.get(name)]
    if not missing:
        host.noop(f"{', '.join(packages)} installed")
        return
    q = shlex.quote
    for unit in masked:
        yield f"ln -sfn /dev/null /etc/systemd/system/{q(unit)}"
    if masked:
        yield "systemctl daemon-reload"
    yield "apt-get update -q"
    yield (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        "-o Dpkg::Options::=--force-confold " + " ".join(q(name) for name in missing)
    )
