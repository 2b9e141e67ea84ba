"""The host's converge state, read by one probe round-trip (hostside/state_probe.py)."""

from __future__ import annotations

import json
from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.host_profile import parse_profile
from kimi_deploy.hostside_command import hostside_command


class KimiHostState(FactBase[dict[str, Any]]):
    """Everything a converge decides on, in one round-trip.

    .. code:: python

        {
            "user": True,
            "venvs": {"/opt/kimi/engines/vllm-0.34.0": {"package": "vllm", ...} | None},
            "weights": {"exists": True, "missing": [], "unverified": [], "extra": []} | None,
            "files": {"/etc/systemd/system/kimi-vllm.service": "<sha256>" | None},
            "units": {"kimi-vllm": {"active": "active", "pid": 1234, "applied": "<digest>"}},
            "listeners": {"8000": {"pid": 1234, "comm": "vllm", "unit": "kimi-vllm"}},
            "current": "/opt/kimi/releases/<id>" | None,
            "hardware": <HostProfile, see facts/hardware.py> | None,
        }

    With ``hardware`` in the request, the hardware probe runs in the same round-trip.
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(self, request: dict[str, Any], hardware: dict[str, Any] | None = None) -> str:
        state = hostside_command("python3", "state_probe.py", request)
        if hardware is None:
            return state
        # Both programs print one line each: hardware first, then state.
        return f"{hostside_command('python3', 'hardware_probe.py', hardware)}; {state}"

    def process(self, output: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(output[-1])
        result["hardware"] = parse_profile(json.loads(output[-2])) if len(output) > 1 else None
        return result
