"""The host's drivers state, read by one probe round-trip (hostside/driver_probe.py)."""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.host.command import ANSWER_MAX_BYTES
from kimi_deploy.host.programs import DRIVER_PROBE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.probe_types import DriversAnswer
from kimi_deploy.hostside.requests import DriversRequest


class DriversState(FactBase[DriversAnswer]):
    """Installed NVIDIA packages and holds, the loaded driver and NVML's, services, files, sysctls:
    ``hostside.probe_types.DriversAnswer``.

    .. code:: python

        {
            "os": {"id": "debian", "version_id": "12", "pretty": "...", "arch": "amd64"},
            "kernel": "6.1.0-26-amd64", "headers": False,
            "packages": {"nvidia-driver-cuda": {"version": "580.95.05-1", "held": True}},
            "sources": ["deb [signed-by=...] https://.../debian12/x86_64/ /"],
            "module": "580.95.05" | None,
            "nvml": {"version": "580.95.05"} | {"error": "..."} | None,
            "reboot_required": ["nvidia-driver-cuda"] | None,
            "services": {"nvidia-fabricmanager": {"active": "active", "enabled": "enabled"}},
            "files": {"/etc/nvidia-imex/nodes_config.cfg": "<sha256>" | None},
            "sysctl": {"vm.max_map_count": "65530"},
            "boot_id": "...",
        }
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(self, request: DriversRequest) -> str:
        return DRIVER_PROBE.command("python3", request)

    def process(self, output: list[str]) -> DriversAnswer:
        return parse(output[-1])


def parse(line: str) -> DriversAnswer:
    """The drivers probe's answer line, alone or within the host probe's; its error raised."""
    result = loads(line, "drivers probe", max_bytes=ANSWER_MAX_BYTES)
    if isinstance(result, dict) and "error" in result:
        raise ValueError(f"drivers probe: {result['error']}")
    answer: DriversAnswer = result
    return answer
