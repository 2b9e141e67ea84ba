"""The smoke test: after a (re)start, the engine answers a real request with the right content."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from kimi_deploy.host.programs import ROUTER_DRAIN, ROUTER_VIEW, SMOKE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.requests import DrainRequest, RouterViewRequest, SmokePlan, SmokeRequest
from kimi_deploy.hostside.state_probe import APPLIED
from kimi_pyinfra.operations.connector import connector_arguments

# Beyond a drain's own bound: the router's answers and the program's start.
DRAIN_SLACK_S = 60


def _said(command: str, what: str, line: Callable[[Any], str], timeout_s: int | None = None) -> FunctionCommand:
    """A host program as one command: when it fails, its own lines (its one ``kimi-deploy:`` line
    and what follows it); when it passes, its JSON answer said in one line by ``line``. Made while
    an operation yields its commands: the program runs with that operation's connector arguments
    (``_sudo``, ``_su_user``, ...), as pyinfra runs a shell command it yields."""
    arguments = connector_arguments()
    if timeout_s is not None:
        arguments["_timeout"] = timeout_s

    def run(state: State, host: Host) -> bool:
        ok, output = host.run_shell_command(command, print_output=state.print_output, **arguments)
        if not ok:
            # (with -v, pyinfra printed them as they came)
            for text in [] if state.print_output else output.stderr_lines or output.stdout_lines or [f"{what} failed"]:
                host.log_styled(text, fg="red", log_func=logger.error)
            return False
        try:
            said = loads((output.stdout_lines or ["{}"])[-1], f"{host.name}: {what}")
        except ValueError as exc:
            host.log_styled(str(exc), fg="red", log_func=logger.error)
            return False
        host.log_styled(line(said), log_func=logger.info)
        return True

    return FunctionCommand(run, (), {})


def _smoke(check: SmokePlan) -> FunctionCommand:
    """``hostside/smoke.py`` for ``check``, its success said with how long the unit was without
    service (for the only instance of a pool: the gap the converge caused its clients)."""
    # Where the smoke test records the restarts of systemd's own it found serving.
    request: SmokeRequest = {
        **check["request"],
        "unit": check["unit"],
        "url": check["url"],
        "restarts": check["restarts"],
        "restarts_file": f"{APPLIED}/{check['unit']}.restarts",
    }
    return _said(
        SMOKE.command("python3", request),
        "smoke test",
        lambda said: smoke_line(check["unit"], check.get("only"), said),
    )


def smoke_line(unit: str, only: str | None, said: Any) -> str:
    """What a passed smoke test found, in one line (``hostside/smoke.py``'s answer ``said``);
    ``only``: the pool (``TOPOLOGY/POOL``) of which ``unit`` is the only instance's API."""
    down = said.get("down_s") if isinstance(said, dict) else None
    if not isinstance(down, (int, float)):
        return f"{unit} answers its smoke test"
    if only:
        return f"{only}: the only instance was without service for {down:.0f} s ({unit} answers again)"
    return f"{unit} answers again, {down:.0f} s after it stopped (the other instances served)"


@operation()
def verified(checks: list[SmokePlan]) -> Generator[FunctionCommand, None, None]:
    """
    Wait (bounded) until each (re)started unit is ready, then check /v1/models and a chat completion.

    + checks: for each unit with an API on this host in this step: ``unit``, ``url`` (its API base
      on the host, ``http://127.0.0.1:8000``), ``request`` (served name, prompt, expected content,
      timeout, API key file and variable), ``restarted`` (whether this run (re)starts it, or
      systemd restarted it on its own since it was last checked: a unit left running is not
      re-checked), ``restarts`` (systemd's restarts of it already seen) and ``only`` (its pool,
      ``TOPOLOGY/POOL``, when it is the API of that pool's only instance; else None); may be empty
    """
    todo = [c for c in checks if c["restarted"]]
    if not todo:
        host.noop(
            f"{', '.join(c['unit'] for c in checks)} serve the release they were verified with"
            if checks
            else "no unit of this host to check in this step"
        )
        return
    for c in todo:
        yield _smoke(c)


@operation()
def routed(request: RouterViewRequest | None) -> Generator[str, None, None]:
    """
    Wait (bounded) until the router sends to the engines a batch (re)started, before the next
    batch stops anything (``hostside/router_view.py``).

    + request: the router view's request (``kimi_deploy.serving.router_view``); None: this host has
      no router to wait on after this batch
    """
    if request is None:
        host.noop("no router of this host to wait on after this batch")
        return
    yield ROUTER_VIEW.command("python3", request)


def _drain(request: DrainRequest, phase: str) -> FunctionCommand:
    """``hostside/router_drain.py`` in ``phase``, its outcome said in one line on the router host."""
    command = ROUTER_DRAIN.command("python3", request | {"phase": phase})
    return _said(
        command,
        "router drain",
        lambda said: drain_line(request["router"], phase, said),
        int(request["timeout_s"]) + DRAIN_SLACK_S,
    )


def drain_line(router: str, phase: str, said: Any) -> str:
    """What a drain did, in one line (``hostside/router_drain.py``'s answer ``said``)."""
    if not isinstance(said, dict):
        return f"{router}: {phase}: no answer"
    if said.get("said"):
        return f"{router}: {said['said']}"
    if phase == "in":
        added = said.get("added") or []
        return f"{router} sends to {', '.join(added)} again" if added else f"{router} lists every engine already"
    drained = said.get("drained_s") or {}
    parts = [f"{url} in {s:.1f} s" for url, s in drained.items()]
    left = said.get("left") or {}
    parts += [f"{url} still held {n:g} requests after {said.get('waited_s')} s" for url, n in left.items()]
    return f"{router} sends no new request to the batch: drained {'; '.join(parts) or 'nothing'}"


@operation()
def drained(request: DrainRequest | None) -> Generator[FunctionCommand, None, None]:
    """
    Before a batch restarts engines behind a running router: the router sends them no new
    request, and the requests in flight on them end (bounded; ``hostside/router_drain.py``).

    + request: the drain's request (``kimi_deploy.serving.router_drain``); None: this host has no
      router to drain in this batch
    """
    if request is None:
        host.noop("no router of this host to drain in this batch")
        return
    yield _drain(request, "out")


@operation()
def readmitted(request: DrainRequest | None) -> Generator[FunctionCommand, None, None]:
    """
    Once a batch's engines answer their smoke tests: the router sends to them again.

    + request: the same request as ``drained``'s; None: nothing of this host to put back
    """
    if request is None:
        host.noop("no router of this host to put engines back in after this batch")
        return
    yield _drain(request, "in")
