"""Parse ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``.

:func:`parse_query` returns one dict per GPU line, in output order::

    [{"name": "NVIDIA H200", "memory.total": 143771, "pcie.link.gen.max": 5, "pcie.link.width.max": 16}, ...]

- Keys are the field names the header prints, without their unit (``memory.total [MiB]`` ->
  ``memory.total``); nvidia-smi prints some aliases under their canonical name (``clocks.sm`` as
  ``clocks.current.sm``). Without a header the caller passes ``fields`` (the ``--query-gpu`` list)
  and those are the keys.
- Units are dropped from values (``143771 MiB`` -> ``143771``). Fields that measure something
  (``memory.*`` in MiB, ``utilization.*``, ``temperature.*``, ``power.*``, ``clocks.*``, ``fan.speed``,
  ``pcie.link.*``, ``index``, ``count``, ``ecc.errors.*``, ...) and any value printed with a unit are
  numbers: int when integral, else float. Every other field stays the printed string
  (``driver_version`` ``"550.144"``, ``pci.bus_id``, ``pci.device_id`` ``"0x232110DE"``).
- A value nvidia-smi cannot give (``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Unknown Error]``,
  any other ``[...]`` placeholder) is None.

When nvidia-smi printed one of its failure texts instead of a table (``Failed to initialize NVML:
Driver/library version mismatch``, ``NVIDIA-SMI has failed because it couldn't communicate with the
NVIDIA driver``, ``No devices were found``, ...), :func:`parse_query` raises
:class:`NvidiaSmiFailure`, a :class:`~kimi_deploy.parsers.ParseError` whose ``failure`` holds the
same dict :func:`find_failure` returns. Raising rather than returning keeps a broken driver from
reading as a host with no GPUs; a caller that wants the failure as data calls :func:`find_failure`.
Any other text that is not such a table raises :class:`~kimi_deploy.parsers.ParseError`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kimi_deploy.parsers import ParseError, read_int

Value = str | int | float | None

# (kind, text nvidia-smi prints): the specific texts first, the generic NVML one last.
FAILURES = (
    ("driver_library_mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
    ("driver_unreachable", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
    ("no_devices", "No devices were found"),
    ("device_handle_error", "Unable to determine the device handle for"),
    ("nvml_init_failed", "Failed to initialize NVML"),
)
# Field-name prefixes whose values are quantities; everything else is kept as printed.
NUMERIC_FIELDS = (
    "index",
    "count",
    "memory.",
    "utilization.",
    "temperature.",
    "power.",
    "enforced.power.",
    "clocks.",
    "clocks_event_reasons_counters.",
    "fan.speed",
    "pcie.link.",
    "ecc.errors.",
    "retired_pages.",
    "encoder.stats.",
)
_HEADER_CELL = re.compile(r"(?P<field>[a-z][a-z0-9_.]*)(?: \[[^\]]+\])?")
_NUMBER = re.compile(r"(?P<number>-?\d+(?:\.\d+)?)(?: ?(?P<unit>[A-Za-z%/]+))?")
# Units nvidia-smi appends to values without ``nounits``.
UNITS = frozenset({"%", "B", "KiB", "MiB", "GiB", "KiB/s", "MiB/s", "MHz", "W", "C", "J", "mJ", "us", "ms", "s"})
_NVML_VERSION = re.compile(r"NVML library version:\s*(\S+)")


class NvidiaSmiFailure(ParseError):
    """nvidia-smi printed a failure instead of a table; ``failure`` is :func:`find_failure`'s dict."""

    def __init__(self, failure: dict[str, str]) -> None:
        self.failure = failure
        version = failure.get("nvml_library_version")
        detail = f" (NVML library version {version})" if version else ""
        super().__init__(f"nvidia-smi failed: {failure['message']}{detail}")


def find_failure(text: str) -> dict[str, str] | None:
    """``{"kind", "message"[, "nvml_library_version"]}`` for a known nvidia-smi failure text, else None.

    ``kind`` is one of ``driver_library_mismatch``, ``driver_unreachable``, ``no_devices``,
    ``device_handle_error``, ``nvml_init_failed``; ``message`` is the line nvidia-smi printed.
    """
    lines = [line.strip() for line in text.splitlines()]
    for kind, needle in FAILURES:
        for line in lines:
            if needle in line:
                failure = {"kind": kind, "message": line}
                version = _NVML_VERSION.search(text)
                if version:
                    failure["nvml_library_version"] = version.group(1)
                return failure
    return None


def parse_query(text: str, fields: Sequence[str] | None = None) -> list[dict[str, Value]]:
    """Per-GPU values of a ``--query-gpu`` CSV (shape in the module docstring).

    ``fields`` is the ``--query-gpu`` list; it is needed only for ``noheader`` output. With a header
    the header's names are the keys, and ``fields``, when given, must have as many names.
    """
    failure = find_failure(text)
    if failure:
        raise NvidiaSmiFailure(failure)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError("no output")
    header = _header(lines[0])
    if header is not None:
        names = header
        if fields is not None and len(fields) != len(names):
            raise ParseError(f"the header has {len(names)} fields, the query {len(fields)}")
        rows = lines[1:]
    elif fields is not None:
        names = [field.strip() for field in fields]
        rows = lines
    else:
        raise ParseError(f"no header line ({lines[0]!r} is data): pass the query's field list")
    gpus: list[dict[str, Value]] = []
    for number, line in enumerate(rows, start=1):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(names):
            raise ParseError(f"GPU line {number} has {len(cells)} values for {len(names)} fields: {line!r}")
        gpus.append({name: _value(name, cell) for name, cell in zip(names, cells, strict=True)})
    return gpus


def _header(line: str) -> list[str] | None:
    # A header cell is a lowercase field name, with its unit in brackets unless ``nounits``.
    matches = [_HEADER_CELL.fullmatch(cell.strip()) for cell in line.split(",")]
    if not all(matches):
        return None
    return [m.group("field") for m in matches if m]


def _value(field: str, cell: str) -> Value:
    if cell in ("", "N/A") or (cell.startswith("[") and cell.endswith("]")):
        return None
    number = _NUMBER.fullmatch(cell)
    if number is None:
        return cell
    unit = number.group("unit")
    if (unit is None and field.startswith(NUMERIC_FIELDS)) or unit in UNITS:
        digits = number.group("number")
        return float(digits) if "." in digits else read_int(digits, field)
    return cell
