"""The communication check across the hosts of a topology, before any engine (re)starts."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside_command import hostside_command


@operation()
def passed(*, request: dict[str, Any] | None, why_not: str = "") -> Generator[str, None, None]:
    """
    Check that this host and every other host of its topology reach each other's ports, with
    enough bandwidth, all hosts at once; fail (on every host of the topology) otherwise.

    + request: ``hostside/commcheck.py``'s request (``kimi_deploy.commcheck_plan.check_request``);
      None when no engine of the topology is (re)started this run
    + why_not: with ``request`` None, why the check is not needed

    Every host of the topology runs it in the same operation, so pyinfra starts them together;
    listeners, probes and the exchange of results are bounded by the request's deadline.
    """
    if request is None:
        host.noop(why_not)
        return
    yield hostside_command("python3", "commcheck.py", request)
