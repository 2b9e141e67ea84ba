"""The smoke test: after a (re)start, the engine answers a real request with the right content."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside_command import hostside_command


@operation()
def verified(unit: str, url: str, request: dict[str, Any], restarted: bool) -> Generator[str, None, None]:
    """
    Wait (bounded) until ``unit`` is ready, then check /v1/models and a chat completion.

    + unit: the engine unit
    + url: its API base on the host (``http://127.0.0.1:8000``)
    + request: served name, prompt, expected content, timeout, API key file and variable
    + restarted: whether this run (re)starts the unit; a unit left running is not re-checked
    """
    if not restarted:
        host.noop(f"{unit} serves the release it was verified with")
        return
    yield hostside_command("python3", "smoke.py", {"unit": unit, "url": url, **request})
