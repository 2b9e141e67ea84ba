"""The host's converge state, read by one probe round-trip (hostside/host_probe.py)."""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.host.command import ANSWER_MAX_BYTES, NOT_KEPT, NotKept
from kimi_deploy.host.profile import parse_profile
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.host.programs import HOST_PROBE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.requests import DriversRequest, HardwareRequest, HostProbeRequest, StateRequest
from kimi_pyinfra.facts.drivers import parse as parse_drivers


class KimiHostState(FactBase[HostState]):
    """Everything a converge decides on, in one round-trip: ``hostside.probe_types.HostState``.

    .. code:: python

        {
            "user": True,
            "venvs": {"/opt/kimi/engines/vllm-0.34.0": {"package": "vllm", ...} | None},
            "weights": {"/srv/models/<org>--<name>/<commit>": {"exists": True, "missing": [], "unverified": [],
                        "extra": []}},  # each checkpoint the host holds: the model, a draft
            "files": {"/etc/systemd/system/kimi-vllm.service": "<sha256>" | None},
            "units": {"kimi-vllm": {"active": "active", "pid": 1234, "applied": "<digest>", ...}},
            "timers": {"kimi-weights-scrub": {"active": "active", "enabled": "enabled"}},
            "revisions": {"/srv/models/<org>--<name>": {"present": ["<commit>"], "history": ["<commit>"]}},
            "listeners": {"8000": {"pid": 1234, "comm": "vllm", "unit": "kimi-vllm"}},
            "packages": {"nginx": True},
            "current": "/opt/kimi/releases/<id>" | None,
            "last_release": ["<time>", "/opt/kimi/releases/<id>", "serving"] | None,
            "releases": {"entries": [...], "records": {...}} | None,
            "hardware": <HostProfile, see facts/hardware.py> | None,
            "drivers": <see facts/drivers.py> | None,
        }

    With ``hardware`` (``drivers``) in the request, the hardware (drivers) probe runs in the same
    round-trip and the same process (hostside/host_probe.py).
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(
        self,
        request: StateRequest,
        hardware: HardwareRequest | None = None,
        drivers: DriversRequest | None = None,
        kept: bool = True,
    ) -> str:
        # One process (hostside/host_probe.py) for every part: one tagged JSON line each. The probe
        # runs on every host on every run: it names the host's compiled copy of itself, sent whole
        # only to a host that keeps none (``kept=False``, after ``NotKept``: inventory_probe.fetched).
        parts: HostProbeRequest = {"state": request}
        if hardware is not None:
            parts["hardware"] = hardware
        if drivers:
            parts["drivers"] = drivers
        return HOST_PROBE.command("python3", parts, kept)

    def process(self, output: list[str]) -> HostState:
        if output[:1] == [NOT_KEPT]:
            raise NotKept(HOST_PROBE.script)
        lines = dict(line.split(" ", 1) for line in output if " " in line)
        result: HostState = loads(lines["state"], "state probe", max_bytes=ANSWER_MAX_BYTES)
        hardware = lines.get("hardware")
        result["hardware"] = (
            parse_profile(loads(hardware, "hardware probe", max_bytes=ANSWER_MAX_BYTES)) if hardware else None
        )
        result["drivers"] = parse_drivers(lines["drivers"]) if "drivers" in lines else None
        return result
