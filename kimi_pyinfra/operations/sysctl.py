"""Kernel settings read from /etc/sysctl.d, applied to the running kernel."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Mapping

from pyinfra.api.operation import operation
from pyinfra.context import host


@operation()
def applied(file: str, values: Mapping[str, str], current: Mapping[str, str | None]) -> Generator[str, None, None]:
    """
    Make the running kernel use the settings of ``file`` (which keeps them across boots).

    + file: the sysctl.d file holding ``values``
    + values: setting -> value, as the kernel prints it (``vm.max_map_count`` -> ``1048576``)
    + current: the running kernel's values, from the probe
    """
    if all(" ".join(str(current.get(k) or "").split()) == v for k, v in values.items()):
        host.noop(", ".join(f"{k} is {v}" for k, v in sorted(values.items())))
        return
    yield f"sysctl -q -p {shlex.quote(file)}"
