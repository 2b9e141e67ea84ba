"""A host's hardware spec: its accelerators and, optionally, a small weights disk.

``b300x8`` is eight B300 GPUs; ``b300x8-smalldisk`` is the same host whose /srv/models is an
8 MiB filesystem of its own: room for the demo model's 6 MB, not for a rollback copy beside it.
``gb300x4-ubuntu24.04`` is a host running Ubuntu 24.04 instead of Debian 12 (the suffix last).
"""

from __future__ import annotations

from dataclasses import dataclass

SMALL_DISK_SUFFIX = "-smalldisk"
DEFAULT_OS = "debian12"
UBUNTU_2404 = "ubuntu24.04"
OS_SUFFIXES = {f"-{UBUNTU_2404}": UBUNTU_2404}
SMALL_DISK_BYTES = 8 * 2**20
MODELS_DIR = "/srv/models"


@dataclass(frozen=True)
class HardwareSpec:
    accelerators: str
    models_disk_bytes: int | None
    os: str = DEFAULT_OS


def parse_spec(spec: str) -> HardwareSpec:
    host_os = DEFAULT_OS
    for suffix, named in OS_SUFFIXES.items():
        if spec.endswith(suffix):
            spec, host_os = spec[: -len(suffix)], named
    if spec.endswith(SMALL_DISK_SUFFIX):
        return HardwareSpec(spec[: -len(SMALL_DISK_SUFFIX)], SMALL_DISK_BYTES, host_os)
    return HardwareSpec(spec, None, host_os)
