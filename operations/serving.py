"""The smoke test: after a (re)start, the engine answers a real request with the right content."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from hostside.state_probe import APPLIED
from kimi_deploy.hostside_command import hostside_command


@operation()
def verified(checks: list[dict[str, Any]]) -> Generator[str, None, None]:
    """
    Wait (bounded) until each (re)started unit is ready, then check /v1/models and a chat completion.

    + checks: for each unit with an API on this host in this step: ``unit``, ``url`` (its API base
      on the host, ``http://127.0.0.1:8000``), ``request`` (served name, prompt, expected content,
      timeout, API key file and variable), ``restarted`` (whether this run (re)starts it, or
      systemd restarted it on its own since it was last checked: a unit left running is not
      re-checked) and ``restarts`` (systemd's restarts of it already seen); may be empty
    """
    todo = [c for c in checks if c["restarted"]]
    if not todo:
        host.noop(f"{', '.join(c['unit'] for c in checks)} serve the release they were verified with" if checks
                  else "no unit of this host to check in this step")  # fmt: skip
        return
    for c in todo:
        # Where the smoke test records the restarts of systemd's own it found serving.
        record = {"restarts": c.get("restarts", 0), "restarts_file": f"{APPLIED}/{c['unit']}.restarts"}
        yield hostside_command("python3", "smoke.py", {"unit": c["unit"], "url": c["url"], **c["request"], **record})


@operation()
def routed(request: dict[str, Any] | None) -> Generator[str, None, None]:
    """
    Wait (bounded) until the router sends to the engines a batch (re)started, before the next
    batch stops anything (``hostside/router_view.py``).

    + request: the router view's request (``kimi_deploy.router_view_plan``); None: this host has
      no router to wait on after this batch
    """
    if request is None:
        host.noop("no router of this host to wait on after this batch")
        return
    yield hostside_command("python3", "router_view.py", request)
