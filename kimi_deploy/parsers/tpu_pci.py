"""Detect Google TPUs from sysfs-like PCI listings and ``ls -l`` of ``/dev/vfio`` or ``/dev/accel*``.

:func:`parse_tpu_pci` reads any mix of:

- PCI devices: a line naming a PCI address (``0000:00:04.0``) followed, on it or on the next lines,
  by ``vendor: 0x1ae0`` and ``device: 0x006f`` (sysfs ``vendor``/``device`` files as a probe prints
  them, e.g. under ``/sys/kernel/iommu_groups/N/devices/``), or ``lspci -nn`` lines (``[1ae0:006f]``);
- device nodes: ``ls -l`` lines of character devices, either with full paths (``ls -l /dev/accel*``)
  or bare names under a ``/dev/vfio:`` or ``--- /dev/vfio ---`` heading (``ls -l /dev/vfio``).

and returns::

    {"devices": [{"pci_address": "0000:00:04.0", "vendor_id": "0x1ae0", "device_id": "0x006f",
                  "generation": "v6e", "iommu_group": 0}, ...],
     "nodes": [{"path": "/dev/vfio/0", "major": 245, "minor": 2}, ...],
     "generation": "v6e",
     "chip_count": 4}

- ``devices``: every PCI device of Google's vendor id (0x1ae0); ``generation`` comes from
  :data:`TPU_GENERATIONS` and is None for a Google device that is not a TPU (a gVNIC, say).
  ``iommu_group`` is None unless the path names one. Ids are lowercase ``0x`` plus four hex digits.
- ``nodes``: the accelerator device nodes, ``/dev/vfio/N`` (not the ``/dev/vfio/vfio`` container
  node) and ``/dev/accelN``.
- ``generation``: the one TPU generation of the devices; None without TPU devices or when they mix.
- ``chip_count``: the TPU devices when PCI devices were listed, else the accelerator nodes.

Raises :class:`~kimi_deploy.parsers.ParseError` when the text has neither.
"""

from __future__ import annotations

import re
from typing import Any

from kimi_deploy.parsers import ParseError, read_int

GOOGLE_VENDOR_ID = "0x1ae0"
# PCI device id of each TPU generation's chip (vendor 0x1ae0): the one table of them.
TPU_GENERATIONS = {
    "0x005e": "v4",
    "0x0063": "v5e",
    "0x0062": "v5p",
    "0x006f": "v6e",
    "0x0076": "7x",
}

_PCI_ADDRESS = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_IOMMU_GROUP = re.compile(r"iommu_groups/(\d+)/")
_ID_PAIR = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_ID_FIELD = re.compile(r"\b(vendor|device)\s*:\s*(0x[0-9a-fA-F]{1,4})\b")
# Each part is told from the next by its characters alone, so a line is read without backtracking
# (one "\s" after the minor number, not "\s+": ".*" takes the rest of the blanks).
_LS_CHAR_DEVICE = re.compile(r"c[-rwxsStT]{9}\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(\S+)")
_ACCELERATOR_NODE = re.compile(r"/dev/(?:vfio/\d+|accel\d+)")


def parse_tpu_pci(text: str) -> dict[str, Any]:
    """TPU devices and device nodes listed in ``text`` (shape in the module docstring)."""
    devices: list[dict[str, Any]] = []
    nodes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    directory = ""
    for line in text.splitlines():
        stripped = line.strip()
        heading = _heading(stripped)
        if heading:
            directory = heading
            continue
        node = _LS_CHAR_DEVICE.fullmatch(stripped)
        if node:
            name = node.group(3)
            path = name if name.startswith("/") else f"{directory}/{name}"
            if _ACCELERATOR_NODE.fullmatch(path):
                major, minor = read_int(node.group(1), path), read_int(node.group(2), path)
                nodes.append({"path": path, "major": major, "minor": minor})
            continue
        address = _PCI_ADDRESS.search(stripped)
        if address:
            group = _IOMMU_GROUP.search(stripped)
            current = {
                "pci_address": address.group(1).lower(),
                "vendor_id": None,
                "device_id": None,
                "iommu_group": read_int(group.group(1), "iommu_groups") if group else None,
            }
            devices.append(current)
            pair = _ID_PAIR.search(stripped)
            if pair:
                current["vendor_id"], current["device_id"] = _id(pair.group(1)), _id(pair.group(2))
        if current is not None:
            for field, value in _ID_FIELD.findall(stripped):
                current[f"{field}_id"] = _id(value)
    google = [d for d in devices if d["vendor_id"] == GOOGLE_VENDOR_ID]
    for device in google:
        device["generation"] = TPU_GENERATIONS.get(device["device_id"])
    if not devices and not nodes:
        raise ParseError("no PCI device and no /dev/vfio or /dev/accel node listed")
    tpus = [d for d in google if d["generation"]]
    generations = {d["generation"] for d in tpus}
    return {
        "devices": [{key: d[key] for key in _DEVICE_KEYS} for d in google],
        "nodes": nodes,
        "generation": generations.pop() if len(generations) == 1 else None,
        "chip_count": len(tpus) if devices else len(nodes),
    }


_DEVICE_KEYS = ("pci_address", "vendor_id", "device_id", "generation", "iommu_group")


def _heading(line: str) -> str | None:
    """The directory a heading names (``/dev/vfio:``, ``--- /dev/vfio ---``), else None."""
    name = line.strip("-").strip()
    name = name.removesuffix(":")
    if not name.startswith("/dev/") or len(name) == len("/dev/") or any(c.isspace() for c in name):
        return None
    return name.rstrip("/")


def _id(value: str) -> str:
    return "0x" + value.lower().removeprefix("0x").rjust(4, "0")
