"""Parse ``nvidia-smi topo -m``: the devices, the link between every pair, affinities and NIC names.

:func:`parse_topo` returns::

    {
      "gpus": [{"name": "GPU0", "index": 0, "cpu_affinity": "0-55,112-167",
                "numa_affinity": "0", "gpu_numa_id": None}, ...],
      "nics": [{"name": "NIC0", "device": "mlx5_0"}, ...],
      "matrix": {"GPU0": {"GPU0": "X", "GPU1": "NV18", "NIC0": "PXB", ...}, ...},
      "legend": {"X": "Self", "SYS": "Connection traversing PCIe as well as ...", "NV#": "..."},
      "nic_legend": {"NIC0": "mlx5_0", ...},
    }

- ``gpus`` and ``nics`` keep the header's order. A GPU has one key per affinity column the header
  has (``cpu_affinity``, ``numa_affinity``, ``gpu_numa_id``), holding the printed string, or None
  for ``N/A`` or a value the row does not print.
- ``matrix[a][b]`` is the printed link type from row ``a`` to column ``b`` for every pair of
  devices, ``"X"`` on the diagonal (``NV18``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``, ...).
- ``nics[i]["device"]`` is the RDMA device the NIC Legend names; without a legend it is None for a
  ``NICn`` column and the column's own name for older drivers that print ``mlx5_0`` in the header.
- ``legend`` and ``nic_legend`` are ``{}`` when the output has no such section.

Columns may be separated by tabs or spaces, lines may end in CRLF, and the header may carry ANSI
underline/bold codes with or without their ESC byte (``\\x1b[4m`` or a literal ``[4m``).
Anything else (no header, a missing or short row, a link cell that is not a link, a NIC Legend
entry for a NIC the matrix lacks) raises :class:`~kimi_deploy.parsers.ParseError`, and nothing else.
"""

from __future__ import annotations

import re

from kimi_deploy.host.profile_types import TopoGpu, Topology, TopoNic
from kimi_deploy.parsers import ParseError, read_int

Row = dict[str, str]

# SGR codes as nvidia-smi prints them, and as they read once a log or a paste dropped the ESC byte.
_ANSI = re.compile(r"\x1b?\[[0-9;]*m")
# Header labels of the columns after the matrix, and the key each gets in a GPU entry.
_AFFINITY_COLUMNS = (
    (re.compile(r"CPU\s+Affinity"), "cpu_affinity"),
    (re.compile(r"NUMA\s+Affinity"), "numa_affinity"),
    (re.compile(r"GPU\s+NUMA\s+ID"), "gpu_numa_id"),
)
_GPU = re.compile(r"GPU(\d+)")
_NIC = re.compile(r"NIC\d+")
_DEVICE = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*")
_LINK = re.compile(r"X|[A-Z][A-Z0-9]*")
_LEGEND_ENTRY = re.compile(r"(\S+)\s*=\s*(\S.*)")


def parse_topo(text: str) -> Topology:
    """The topology ``nvidia-smi topo -m`` printed in ``text`` (shape in the module docstring)."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    start = _header_index(lines)
    devices, columns = _header(lines[start])
    matrix: dict[str, Row] = {}
    affinity: dict[str, dict[str, str | None]] = {}
    end = len(lines)
    for number in range(start + 1, len(lines)):
        tokens = lines[number].split()
        if not tokens:
            continue
        if tokens[0] in ("Legend:", "NIC"):
            end = number
            break
        if tokens[0] not in devices:
            raise ParseError(f"line {number + 1}: {lines[number].strip()!r} is not a row of the topology matrix")
        name = tokens[0]
        if name in matrix:
            raise ParseError(f"line {number + 1}: a second row for {name}")
        matrix[name], affinity[name] = _row(name, tokens[1:], devices, columns)
    missing = [d for d in devices if d not in matrix]
    if missing:
        raise ParseError(f"no matrix row for {', '.join(missing)}")
    legend, nic_legend = _legends(lines[end:])
    for nic in nic_legend:
        if nic not in devices:
            raise ParseError(f"the NIC Legend names {nic}, which the matrix lacks")
    gpus: list[TopoGpu] = []
    nics: list[TopoNic] = []
    for name in devices:
        gpu = _GPU.fullmatch(name)
        if gpu:
            entry: TopoGpu = {"name": name, "index": read_int(gpu.group(1), f"header column {name[:40]}")}
            columns_of = affinity[name]  # the affinity columns the header has, each a key of TopoGpu
            if "cpu_affinity" in columns_of:
                entry["cpu_affinity"] = columns_of["cpu_affinity"]
            if "numa_affinity" in columns_of:
                entry["numa_affinity"] = columns_of["numa_affinity"]
            if "gpu_numa_id" in columns_of:
                entry["gpu_numa_id"] = columns_of["gpu_numa_id"]
            gpus.append(entry)
        else:
            own = None if _NIC.fullmatch(name) else name
            nics.append({"name": name, "device": nic_legend.get(name, own)})
    return {"gpus": gpus, "nics": nics, "matrix": matrix, "legend": legend, "nic_legend": nic_legend}


def _header_index(lines: list[str]) -> int:
    # The header is the first line led by a GPU column name; unlike a row it has no "X" cell.
    for number, line in enumerate(lines):
        tokens = line.split()
        if tokens and _GPU.fullmatch(tokens[0]) and "X" not in tokens:
            return number
    raise ParseError("no header line naming the GPU columns (GPU0 ...)")


def _header(line: str) -> tuple[list[str], list[str]]:
    found: list[tuple[int, str]] = []
    for pattern, key in _AFFINITY_COLUMNS:
        match = pattern.search(line)
        if match:
            found.append((match.start(), key))
            line = line[: match.start()] + " " * (match.end() - match.start()) + line[match.end() :]
    devices = line.split()
    for name in devices:
        if not _DEVICE.fullmatch(name):
            raise ParseError(f"header column {name!r} is not a device name")
    if len(set(devices)) != len(devices):
        raise ParseError("the header names a device twice")
    return devices, [key for _, key in sorted(found)]


def _row(name: str, cells: list[str], devices: list[str], columns: list[str]) -> tuple[Row, dict[str, str | None]]:
    if len(cells) < len(devices):
        raise ParseError(f"row {name} has {len(cells)} cells for {len(devices)} devices")
    links: Row = {}
    for device, cell in zip(devices, cells, strict=False):
        if not _LINK.fullmatch(cell) or (cell == "X") != (device == name):
            raise ParseError(f"row {name}, column {device}: {cell!r} is not a link type")
        links[device] = cell
    rest = cells[len(devices) :]
    if not _GPU.fullmatch(name):
        if rest:
            raise ParseError(f"row {name} has {len(rest)} cells past the matrix")
        return links, {}
    if len(rest) > len(columns):
        raise ParseError(f"row {name} has {len(rest)} values for {len(columns)} affinity columns")
    values: dict[str, str | None] = {}
    for position, key in enumerate(columns):
        value = rest[position] if position < len(rest) else None
        values[key] = None if value == "N/A" else value
    return links, values


def _legends(lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    legend: dict[str, str] = {}
    nic_legend: dict[str, str] = {}
    section: dict[str, str] | None = None
    for line in lines:
        text = " ".join(line.split())
        if text == "Legend:":
            section = legend
        elif text == "NIC Legend:":
            section = nic_legend
        elif section is legend:
            entry = _LEGEND_ENTRY.fullmatch(text)
            if entry:
                legend[entry.group(1)] = entry.group(2)
        elif section is nic_legend:
            nic = _nic_entry(text)
            if nic:
                nic_legend[nic[0]] = nic[1]
    return legend, nic_legend


def _nic_entry(text: str) -> tuple[str, str] | None:
    """``NIC0: mlx5_0`` (a line of the NIC legend, its blanks single) as ``("NIC0", "mlx5_0")``,
    also written ``NIC0 : mlx5_0``, ``NIC0 :mlx5_0`` or ``NIC0:mlx5_0``; the name is the longest
    the line allows. By its words, not a pattern: one that tried each colon of a long word as the
    separator would read the rest of the word again for each."""
    words = text.split(" ")
    if len(words) == 3:
        name, colon, device = words
        return (name, device) if colon == ":" and name and device else None
    if len(words) == 2:
        name, device = words
        if device.startswith(":") and len(device) > 1 and name:
            return name, device[1:]
        return (name[:-1], device) if name.endswith(":") and len(name) > 1 and device else None
    if len(words) == 1:
        at = text.rfind(":", 1, len(text) - 1)
        return (text[:at], text[at + 1 :]) if at > 0 else None
    return None
