"""A host's hardware spec: its accelerators and, optionally, a small weights disk.

``b300x8`` is eight B300 GPUs; ``b300x8-smalldisk`` is the same host whose /srv/models is an
8 MiB filesystem of its own: room for the demo model's 6 MB, not for a rollback copy beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

SMALL_DISK_SUFFIX = "-smalldisk"
SMALL_DISK_BYTES = 8 * 2**20
MODELS_DIR = "/srv/models"


@dataclass(frozen=True)
class HardwareSpec:
    accelerators: str
    models_disk_bytes: int | None


def parse_spec(spec: str) -> HardwareSpec:
    if spec.endswith(SMALL_DISK_SUFFIX):
        return HardwareSpec(spec[: -len(SMALL_DISK_SUFFIX)], SMALL_DISK_BYTES)
    return HardwareSpec(spec, None)
