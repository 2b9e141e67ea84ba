"""The host's hardware profile, read by one probe round-trip (hostside/hardware_probe.py)."""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.host.command import ANSWER_MAX_BYTES
from kimi_deploy.host.profile import parse_profile
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.host.programs import HARDWARE_PROBE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.requests import HardwareRequest


class HostHardware(FactBase[HostProfile]):
    """Accelerators, RDMA ports, memory, CPU, OS, the weights disk and NVIDIA driver state, in one
    round-trip of at most a few seconds (see ``kimi_deploy.host.profile`` for every key).

    ``request``: ``{"weights_dir": "/srv/models", "measure": False}``; with ``"measure": True`` the
    probe also times a sequential read there (about 2 s; it writes and removes a 64 MiB file when
    the directory holds no file of 64 MiB or more).

    .. code:: python

        {
            "accelerators": {"vendor": "nvidia", "count": 8, "model": "NVIDIA B300 SXM6 AC",
                             "memory_mib": 275040, "devices": [...], "driver_version": "580.95.05",
                             "cuda_version": None, "source": "nvidia-smi", "error": None,
                             "topology": {...}, "nvlink_active": None, "fabric": None, "tpu": None},
            "rdma": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
                      "rate_gbps": 400, "link_layer": "InfiniBand"}],
            "memory": {"total_bytes": 2163957473280, "available_bytes": 2101234589696},
            "numa_nodes": 2,
            "cpu": {"model": "INTEL(R) XEON(R) PLATINUM 8570", "count": 224},
            "os": {"id": "ubuntu", "version_id": "24.04", "pretty": "Ubuntu 24.04.2 LTS",
                   "kernel": "6.8.0-60-generic"},
            "disk": {"path": "/srv/models", "fs_type": "xfs", "total_bytes": 30000000000000,
                     "free_bytes": 27000000000000, "read_mb_s": None},
            "drivers": {"nvidia": "580.95.05", "packages": {"nvidia-fabricmanager-580": "580.95.05-1"},
                        "fabricmanager_active": "active", "imex_active": "inactive"},
            "errors": {},
        }
    """

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(self, request: HardwareRequest | None = None) -> str:
        return HARDWARE_PROBE.command("python3", request or {})

    def process(self, output: list[str]) -> HostProfile:
        return parse_profile(loads(output[-1], "hardware probe", max_bytes=ANSWER_MAX_BYTES))
