"""The communication check across the hosts of a topology, before any engine (re)starts."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.host.programs import ALLREDUCE, COMMCHECK
from kimi_deploy.hostside.commcheck import TOKEN_CREDENTIAL
from kimi_deploy.hostside.host_dirs import LOG_DIR
from kimi_deploy.hostside.requests import AllReduceRequest, CommCheckListen, CommCheckRequest
from kimi_deploy.listener_sandbox import LISTENER_SANDBOX, stop_unit, transient_service
from kimi_pyinfra.operations.units import replaced
from kimi_pyinfra.rehearsal import Do
from kimi_pyinfra.run_context import run_context

ALL_REDUCE_LOG = f"{LOG_DIR}/all-reduce.log"


# The transient service holding the check's listeners between its steps (``listening`` to ``passed``).
LISTENER_UNIT = "kimi-commcheck"
# Its sandbox: it listens and answers, as a user of its own; nothing else.
_LISTENER_PROPERTIES = (*LISTENER_SANDBOX, "DynamicUser=yes", "MemoryMax=256M", "TasksMax=512")
# How long the listeners may outlive a run that never reached its verdict (a controller gone).
LIFETIME_S = 900
# The check's token on the host while its listener runs: root's alone, read by systemd into the
# listener's credential; on tmpfs, and removed by the verdict step.
TOKEN_FILE = "/run/kimi-commcheck.token"  # noqa: S105 - a path, not the token


def check_steps(do: Do, request: CommCheckRequest | None, why_not: str = "", token: str | None = None) -> None:
    """The communication check as three steps, each taken by every host of the topology before
    the next starts on any (``hostside/commcheck.py``'s phases): the listeners, the probes, the
    verdict. No step waits for another host to start, however many hosts the run drives.

    + request: ``hostside/commcheck.py``'s request (``kimi_deploy.serving.commcheck.check_request``);
      None when no engine of the topology is (re)started this run
    + why_not: with ``request`` None, why the check is not needed
    + token: the check's token, the same on every host of the run (default: the run's own)
    """
    if token is None:
        token = run_context().comm_check_token if request is not None else ""
    do(listening, name="Communication check: listeners", request=request, token=token, why_not=why_not)
    do(probed, name="Communication check: probes", request=request, token=token, why_not=why_not)
    do(passed, name="Communication check", request=request, token=token, why_not=why_not)


@operation()
def listening(*, request: CommCheckRequest | None, token: str = "", why_not: str = "") -> Generator[Any, None, None]:
    """
    Listen on every port this host's peers will reach, as the transient ``kimi-commcheck``
    service (a user of its own, sandboxed), until the verdict step stops it; the step returns
    once it listens (systemd notify). One left by an earlier run is replaced.

    + request, why_not: as ``check_steps``
    + token: the check's token: it reaches the host through standard input into a file root's
      alone, and the listener as a systemd credential (never in argv)
    """
    if request is None:
        host.noop(why_not)
        return
    # root's alone from the start, and whole or not at all (``operations.units.replaced``)
    yield StringCommand(replaced(TOKEN_FILE, len(token.encode()), 0o600, "root", "root"), _stdin=token)
    listen: CommCheckListen = {**request, "phase": "listen", "lifetime_s": LIFETIME_S}
    yield transient_service(
        LISTENER_UNIT,
        f"kimi-deploy: communication check listeners of run {request['run']}",
        (*_LISTENER_PROPERTIES, f"LoadCredential={TOKEN_CREDENTIAL}:{TOKEN_FILE}"),
        COMMCHECK.command("/usr/bin/python3", listen),
    )


@operation()
def probed(*, request: CommCheckRequest | None, token: str = "", why_not: str = "") -> Generator[Any, None, None]:
    """
    Reach every port of every peer (all listen by now) and measure the bandwidth to each; send
    the findings to every peer's listener and this host's own. Fails only on a bad request: the
    verdict step decides.

    + request, why_not: as ``check_steps``
    + token: the check's token, sent on the program's standard input
    """
    if request is None:
        host.noop(why_not)
        return
    yield StringCommand(COMMCHECK.command("python3", {**request, "phase": "probe"}), _stdin=token)


@operation()
def passed(*, request: CommCheckRequest | None, token: str = "", why_not: str = "") -> Generator[Any, None, None]:
    """
    Check that this host and every other host of its topology reach each other's ports, with
    enough bandwidth; fail (on every host of the topology) otherwise, naming the first failure.
    The listeners stop here, and the token's file goes, whatever the outcome.

    + request, why_not: as ``check_steps``
    + token: the check's token, sent on the program's standard input
    """
    if request is None:
        host.noop(why_not)
        return
    verdict = COMMCHECK.command("python3", {**request, "phase": "verdict"})
    after = f"{stop_unit(LISTENER_UNIT)}; rm -f {shlex.quote(TOKEN_FILE)}"
    yield StringCommand(f"{verdict}; rc=$?; {after}; exit $rc", _stdin=token)


@operation()
def all_reduce_passed(
    *, request: AllReduceRequest | None, python: str = "", user: str = "", why_not: str = ""
) -> Generator[str, None, None]:
    """
    Run an all-reduce across the hosts of this host's engine instance, with the engine release's
    torch, as the engine user; fail (on every host of the instance) when a rank does not finish,
    a value comes back wrong or the bus bandwidth is under the recipe's threshold.

    + request: ``hostside/allreduce.py``'s request (``kimi_deploy.serving.allreduce.all_reduce_request``);
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
        f"install -d -m 0755 {LOG_DIR} && out=$({drop} {ALLREDUCE.command(python, request)}); "
        f'rc=$?; printf \'%s %s\\n\' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$out" >> {ALL_REDUCE_LOG}; exit $rc'
    )
