"""Detect Google TPUs from PCI listings, ``ls`` of ``/dev/vfio`` or ``/dev/accel*``, and tpu-info.

:func:`parse_tpu_pci` reads any mix of:

- PCI devices: a line naming a PCI address (``0000:00:04.0``) followed, on it or on the next lines,
  by ``vendor: 0x1ae0`` and ``device: 0x006f`` (sysfs ``vendor``/``device`` files as a probe prints
  them, e.g. under ``/sys/kernel/iommu_groups/N/devices/``); ``lspci -nn`` lines (``[1ae0:006f]``);
  and plain ``lspci`` lines, which name the vendor (``Google, Inc.``) and, as pci.ids names no Cloud
  TPU, print the device id as ``Device 0027``;
- device nodes: ``ls -l`` lines of character devices, either with full paths (``ls -l /dev/accel*``)
  or bare names under a ``/dev/vfio:`` or ``--- /dev/vfio ---`` heading (``ls -l /dev/vfio``), and
  lines of bare paths (``ls /dev/accel*``, ``find /dev``), whose nodes have no major or minor;
- tpu-info's "TPU Chips" table (its box or Markdown form): a row per chip, its node and its type
  (``/dev/accel0 | TPU v4 chip``, ``/dev/vfio/0 | TPU7x chip``).

and returns::

    {"devices": [{"pci_address": "0000:00:04.0", "vendor_id": "0x1ae0", "device_id": "0x006f",
                  "generation": "v6e", "iommu_group": 0}, ...],
     "nodes": [{"path": "/dev/vfio/0", "major": 245, "minor": 2}, ...],
     "chips": [{"path": "/dev/vfio/0", "generation": "v6e"}, ...],
     "generation": "v6e",
     "chip_count": 4}

- ``devices``: every PCI device of Google's vendor id (0x1ae0); ``generation`` comes from
  :data:`TPU_GENERATIONS` and is None for a Google device that is not a TPU (a gVNIC, say).
  ``iommu_group`` is None unless the path names one. Ids are lowercase ``0x`` plus four hex digits.
- ``nodes``: the accelerator device nodes, ``/dev/vfio/N`` (not the ``/dev/vfio/vfio`` container
  node) and ``/dev/accelN``.
- ``chips``: tpu-info's rows.
- ``generation``: the one TPU generation of the devices (else of tpu-info's chips); None without
  either or when they mix.
- ``chip_count``: the TPU chips when PCI devices were listed (the PCI functions of one slot are one
  chip, as tpu-info groups them: a TPU7x chip shows two), else tpu-info's chips, else the nodes. A
  listing of nodes or PCI devices with no TPU among them is a host without one: 0.

Raises :class:`~kimi_deploy.parsers.ParseError`, in one line, when the text lists none of these, and
when it lists PCI devices in a form that hides what they are: a Google device lspci named without its
id, or addresses with neither ids nor a vendor's name (``lspci -nn`` says both); and when tpu-info's
"TPU Chips" table has rows it cannot read: a terminal too narrow cuts the node (``/dev/vf…``) and
wraps the type onto a second line, and counting the rows left would report chips too few.
"""

from __future__ import annotations

import re
from typing import TypedDict

from kimi_deploy.parsers import ParseError, read_int


class TpuPciDevice(TypedDict):
    """A PCI device of Google's vendor id."""

    pci_address: str
    vendor_id: str
    # None: the listing printed the device's vendor file and not its device file
    device_id: str | None
    # None: not a TPU (a gVNIC), or no device id
    generation: str | None
    iommu_group: int | None


class TpuNode(TypedDict):
    """An accelerator device node; ``major`` and ``minor`` are None for a bare path."""

    path: str
    major: int | None
    minor: int | None


class TpuInfoChip(TypedDict):
    """A row of tpu-info's "TPU Chips" table."""

    path: str
    generation: str


class TpuListing(TypedDict):
    """What :func:`parse_tpu_pci` found (shape in the module docstring)."""

    devices: list[TpuPciDevice]
    nodes: list[TpuNode]
    chips: list[TpuInfoChip]
    generation: str | None
    chip_count: int


class _ListedDevice(TypedDict):
    """A PCI device as listed, of any vendor, before the Google ones are kept."""

    pci_address: str
    vendor_id: str | None
    device_id: str | None
    iommu_group: int | None
    # plain lspci named it (its vendor in words), so a missing id is not a listing that hides it
    named: bool


GOOGLE_VENDOR_ID = "0x1ae0"
# PCI device id of each TPU generation's chip (vendor 0x1ae0): the one table of them. Sources:
# tpu-info's TpuChip.from_pci_device_id (AI-Hypercomputer/cloud-accelerator-diagnostics
# tpu_info/tpu_info/device.py @ fe85c12527bd); JAX's jax/_src/hardware_utils.py @ cec06d11 for
# 0x0056, 0x007c and 0x0083; v2 and v3 share 0x0027 (tensorflow/tpu's driver, tpuv2_core.h: only the
# subsystem id, 0x004e or 0x004f, tells them apart).
TPU_GENERATIONS = {
    "0x0027": "v2/v3",
    "0x0056": "v4lite",
    "0x005e": "v4",
    "0x0063": "v5e",
    "0x0062": "v5p",
    "0x006f": "v6e",
    "0x0076": "7x",
    "0x007c": "8t",
    "0x0083": "8i",
}
# pci.ids' name of the vendor, which plain lspci prints in place of 1ae0
GOOGLE_VENDOR_NAME = "Google, Inc."

_PCI_ADDRESS = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_IOMMU_GROUP = re.compile(r"iommu_groups/(\d+)/")
_ID_PAIR = re.compile(r"\[([0-9a-fA-F]{4}):([0-9a-fA-F]{4})\]")
_ID_FIELD = re.compile(r"\b(vendor|device)\s*:\s*(0x[0-9a-fA-F]{1,4})\b")
# Each part is told from the next by its characters alone, so a line is read without backtracking
# (one "\s" after the minor number, not "\s+": ".*" takes the rest of the blanks).
_LS_CHAR_DEVICE = re.compile(r"c[-rwxsStT]{9}\S*\s+\d+\s+\S+\s+\S+\s+(\d+),\s*(\d+)\s.*\s(\S+)")
_ACCELERATOR_NODE = re.compile(r"/dev/(?:vfio/\d+|accel\d+)")
# plain lspci: "00:04.0 Unassigned class [ff00]: Google, Inc. Device 0027" (the class, then the names)
_LSPCI_NAMES = re.compile(r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7] [^:]*: (?P<names>.*)")
_UNNAMED_DEVICE = re.compile(r"Device ([0-9a-fA-F]{4})\b")
# tpu-info's chip type: "TPU v4 chip", "TPU7x chip"
_TPU_INFO_TYPE = re.compile(r"TPU ?(v?[0-9][0-9a-z/]*) chip")


def parse_tpu_pci(text: str) -> TpuListing:
    """TPU devices, device nodes and tpu-info chips listed in ``text`` (shape in the module docstring)."""
    devices: list[_ListedDevice] = []
    nodes: list[TpuNode] = []
    chips: list[TpuInfoChip] = []
    current: _ListedDevice | None = None
    directory = ""
    paths_listed = False
    in_chip_table = False
    unread_rows: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == _TPU_INFO_CHIPS_TITLE:
            in_chip_table = True
            continue
        if in_chip_table:
            if stripped[:1] in _TABLE_LINE_STARTS:
                if _tpu_info_row(stripped) is None and _is_data_row(stripped):
                    unread_rows.append(stripped)
            else:
                in_chip_table = False
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
        words = stripped.split()
        if words and all(word.startswith("/dev/") for word in words):
            # bare paths: ls /dev/accel*, find /dev
            paths_listed = True
            nodes += [{"path": w, "major": None, "minor": None} for w in words if _ACCELERATOR_NODE.fullmatch(w)]
            continue
        chip = _tpu_info_row(stripped)
        if chip:
            chips.append(chip)
            continue
        address = _PCI_ADDRESS.search(stripped)
        if address:
            current = _pci_device(stripped, address.group(1).lower())
            devices.append(current)
        if current is not None:
            for field, value in _ID_FIELD.findall(stripped):
                if field == "vendor":
                    current["vendor_id"] = _id(value)
                else:
                    current["device_id"] = _id(value)
    if unread_rows:
        raise ParseError(
            f"tpu-info's TPU Chips table has {len(unread_rows)} line(s) not of the form '/dev/vfio/0 | TPU v6e chip'"
            f" (first: {unread_rows[0]!r}): the terminal was too narrow and cut or wrapped them; run tpu-info"
            " with a wider terminal (COLUMNS=200 tpu-info)"
        )
    unknown = list(dict.fromkeys(d["pci_address"] for d in devices if d["vendor_id"] is None and not d["named"]))
    if unknown:
        raise ParseError(
            f"PCI devices {', '.join(unknown[:4])}{' ...' if len(unknown) > 4 else ''} listed without their vendor"
            " and device ids: list them with lspci -nn, or sysfs' vendor and device files"
        )
    google: list[TpuPciDevice] = [
        {
            "pci_address": d["pci_address"],
            "vendor_id": GOOGLE_VENDOR_ID,
            "device_id": d["device_id"],
            "generation": TPU_GENERATIONS.get(d["device_id"] or ""),
            "iommu_group": d["iommu_group"],
        }
        for d in devices
        if d["vendor_id"] == GOOGLE_VENDOR_ID
    ]
    if not devices and not nodes and not chips and not paths_listed:
        raise ParseError("no PCI device, no /dev/vfio or /dev/accel node and no tpu-info chip listed")
    tpus = [d for d in google if d["generation"]]
    generations: set[str | None]
    if devices:
        generations = {d["generation"] for d in tpus}
        # one chip per PCI slot (domain:bus:device), its functions together, as tpu-info counts them
        count = len({d["pci_address"].rsplit(".", 1)[0] for d in tpus})
    else:
        generations = {c["generation"] for c in chips}
        count = len(chips) if chips else len(nodes)
    return {
        "devices": google,
        "nodes": nodes,
        "chips": chips,
        "generation": generations.pop() if len(generations) == 1 else None,
        "chip_count": count,
    }


def _pci_device(line: str, address: str) -> _ListedDevice:
    """The device a line names: its ids from ``[vvvv:dddd]``, or from plain lspci's names."""
    group = _IOMMU_GROUP.search(line)
    device: _ListedDevice = {
        "pci_address": address if address.count(":") == 2 else f"0000:{address}",
        "vendor_id": None,
        "device_id": None,
        "iommu_group": read_int(group.group(1), "iommu_groups") if group else None,
        "named": False,
    }
    pair = _ID_PAIR.search(line)
    if pair:
        device["vendor_id"], device["device_id"] = _id(pair.group(1)), _id(pair.group(2))
        return device
    lspci = _LSPCI_NAMES.fullmatch(line)
    if lspci is None:
        return device
    device["named"] = True
    names = lspci.group("names")
    if names.startswith(GOOGLE_VENDOR_NAME):
        unnamed = _UNNAMED_DEVICE.match(names[len(GOOGLE_VENDOR_NAME) :].strip())
        if unnamed is None:
            raise ParseError(f"lspci names a Google device without its id ({line!r}): list it with lspci -nn")
        device["vendor_id"], device["device_id"] = GOOGLE_VENDOR_ID, _id(unnamed.group(1))
    return device


def _tpu_info_row(line: str) -> TpuInfoChip | None:
    """A row of tpu-info's "TPU Chips" table (``│ /dev/accel0 │ TPU v4 chip │ 1 │ 130007 │``), else None."""
    cells = [cell.strip() for cell in line.replace("│", "|").strip("|").split("|")]
    if len(cells) < 2 or not _ACCELERATOR_NODE.fullmatch(cells[0]):
        return None
    kind = _TPU_INFO_TYPE.fullmatch(cells[1])
    if kind is None:
        return None
    return {"path": cells[0], "generation": kind.group(1)}


# tpu-info's chip table: its title line, and the first characters of its lines in box form (Rich) and
# Markdown form; any other line ends the table.
_TPU_INFO_CHIPS_TITLE = "TPU Chips"
_TABLE_LINE_STARTS = frozenset("┏┃┡│└|")


def _is_data_row(line: str) -> bool:
    """A row of a table's body: a box row (``│ ... │``) or a Markdown row other than the header and
    its ``|---|`` rule (the box header is drawn with ``┃``, its rules with ``┏┡└``)."""
    if not line.startswith(("│", "|")):
        return False
    cells = [cell.strip() for cell in line.replace("│", "|").strip("|").split("|")]
    if all(set(cell) <= set("-: ") for cell in cells):
        return False
    return cells[0] not in ("Chip", "Device")


def _heading(line: str) -> str | None:
    """The directory a heading names (``/dev/vfio:``, ``--- /dev/vfio ---``), else None."""
    # "/dev/vfio:" (ls -l of several folders) or "--- /dev/vfio ---"; a bare path is a listed path
    if not (line.endswith(":") or (line.startswith("-") and line.endswith("-"))):
        return None
    name = line.strip("-").strip()
    name = name.removesuffix(":")
    if not name.startswith("/dev/") or len(name) == len("/dev/") or any(c.isspace() for c in name):
        return None
    return name.rstrip("/")


def _id(value: str) -> str:
    return "0x" + value.lower().removeprefix("0x").rjust(4, "0")
