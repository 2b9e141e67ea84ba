"""NVIDIA Xid events in the kernel's log: the driver's report of a GPU error, ``NVRM: Xid
(PCI:<domain>:<bus>:<device>): <code>, <details>`` (older drivers: no ``PCI:``; the details may
start with ``pid=..., name=...``), and the older "fallen off the bus" lines that carry no Xid
(``NVRM: GPU at 0000:01:00.0 has fallen off the bus.``, ``NVRM: The NVIDIA GPU 0000:b3:00.0 ...
fallen off the bus``), read as Xid 79, the code newer drivers give it. Formats from real kernel
logs: tests/fixtures/xid/SOURCES.md.

Which codes say nothing of the GPU's health: application errors, as NVIDIA's Xid catalog
(https://docs.nvidia.com/deploy/xid-errors/) files them and NVIDIA's k8s-device-plugin skips
them before it marks a device unhealthy (internal/rm/health.go: 13, 31, 43, 45, 68, 109). Every
other code is a fault of the GPU, its memory or its links.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
FELL_OFF_THE_BUS = 79

_BUS = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
_XID = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<bus>{_BUS})\): (?P<code>\d+)(?:, (?P<details>.*))?")
_OFF_BUS = re.compile(rf"NVRM: (?:GPU at |The NVIDIA GPU |GPU )(?:PCI:)?(?P<bus>{_BUS})(?:\.\d)?\b.*fallen off the bus")
# the pid and process name some drivers put first (pid='<unknown>', name=<unknown> when none)
_WHO = re.compile(r"^pid=[^,]*, name=[^,]*, ")


@dataclass(frozen=True)
class Xid:
    code: int
    bus: str  # domain:bus:device, lowercase: how nvidia-smi's pci.bus_id ends, less ".function"
    details: str


def parse(message: str) -> Xid | None:
    """The Xid event a kernel message reports, or None."""
    found = _XID.search(message)
    if found:
        details = _WHO.sub("", (found["details"] or "").strip())
        return Xid(int(found["code"]), found["bus"].lower(), details)
    off = _OFF_BUS.search(message)
    if off:
        return Xid(FELL_OFF_THE_BUS, off["bus"].lower(), "GPU has fallen off the bus.")
    return None


def bus_of(pci_bus_id: str) -> str:
    """nvidia-smi's ``pci.bus_id`` (``00000000:3B:00.0``) as an Xid names the GPU (``0000:3b:00``)."""
    head = pci_bus_id.strip().lower().split(".", 1)[0]
    parts = head.split(":")
    if len(parts) != 3:
        return head
    return f"{parts[0][-4:]}:{parts[1]}:{parts[2]}"
