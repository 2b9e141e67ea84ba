"""The communication check across the hosts of a topology, before any engine (re)starts."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from hostside.host_dirs import LOG_DIR
from kimi_deploy.hostside_command import hostside_command

ALL_REDUCE_LOG = f"{LOG_DIR}/all-reduce.log"


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


@operation()
def all_reduce_passed(
    *, request: dict[str, Any] | None, python: str = "", user: str = "", why_not: str = ""
) -> Generator[str, None, None]:
    """
    Run an all-reduce across the hosts of this host's engine instance, with the engine release's
    torch, as the engine user; fail (on every host of the instance) when a rank does not finish,
    a value comes back wrong or the bus bandwidth is under the recipe's threshold.

    + request: ``hostside/allreduce.py``'s request (``kimi_deploy.allreduce_plan.all_reduce_request``);
      None when this host takes part in no all-reduce this run
    + python: the engine release's interpreter (its torch, its NCCL)
    + user: the engine user, whom the ranks run as
    + why_not: with ``request`` None, why

    Each run's result, a JSON line after the time, is appended to ``/var/log/kimi/all-reduce.log``.
    """
    if request is None:
        host.noop(why_not)
        return
    drop = f"setpriv --reuid={shlex.quote(user)} --regid={shlex.quote(user)} --init-groups --reset-env"
    # The result line (bus bandwidth per size, torch and NCCL versions) is kept on the host.
    yield (
        f"install -d -m 0755 {LOG_DIR} && out=$({drop} {hostside_command(python, 'allreduce.py', request)}); "
        f'rc=$?; printf \'%s %s\\n\' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$out" >> {ALL_REDUCE_LOG}; exit $rc'
    )
