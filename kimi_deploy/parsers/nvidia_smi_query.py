"""Parse ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``.

:func:`parse_query` returns one dict per GPU line, in output order::

    [{"name": "NVIDIA H200", "memory.total": 143771, "pcie.link.gen.max": 5, "pcie.link.width.max": 16}, ...]

- Keys are the field names the header prints, without their unit (``memory.total [MiB]`` ->
  ``memory.total``). The header is told from a GPU's values by the field names nvidia-smi documents
  (:mod:`~kimi_deploy.parsers.nvidia_smi_fields`), in any subset and order, with units or without;
  a name the table lacks is kept as printed; nvidia-smi prints some aliases under their canonical name (``clocks.sm`` as
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
from typing import Literal, TypedDict

from kimi_deploy.parsers import ParseError, read_int
from kimi_deploy.parsers.nvidia_smi_fields import QUERY_GPU_FIELDS

Value = str | int | float | None
FailureKind = Literal[
    "driver_library_mismatch", "driver_unreachable", "no_devices", "gpu_lost", "device_handle_error", "nvml_init_failed"
]


class _Failure(TypedDict):
    kind: FailureKind
    message: str


class SmiFailure(_Failure, total=False):
    """A failure text nvidia-smi printed: its kind and line, and the NVML library's version when it says."""

    # total=False, not NotRequired: Python 3.11's TypedDict reads NotRequired only from an evaluated
    # annotation, and this module's are strings
    nvml_library_version: str


# (kind, text nvidia-smi prints): the specific texts first, the generic NVML one last.
FAILURES: tuple[tuple[FailureKind, str], ...] = (
    ("driver_library_mismatch", "Failed to initialize NVML: Driver/library version mismatch"),
    ("driver_unreachable", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
    ("no_devices", "No devices were found"),
    # the GPU fell off the bus: only a reboot brings it back (a device-handle line says so)
    ("gpu_lost", "GPU is lost"),
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
# A header cell: a field name (``pci.baseClass``, ``encoder.stats.sessionCount``: not all lowercase)
# with its unit in brackets unless ``nounits``.
_HEADER_CELL = re.compile(r"(?P<field>[A-Za-z][A-Za-z0-9_.]*)(?: \[(?P<unit>[^\]]+)\])?")
_NUMBER = re.compile(r"(?P<number>-?\d+(?:\.\d+)?)(?: ?(?P<unit>[A-Za-z%/]+))?")
# Units nvidia-smi appends to values without ``nounits``.
UNITS = frozenset({"%", "B", "KiB", "MiB", "GiB", "KiB/s", "MiB/s", "MHz", "W", "C", "J", "mJ", "us", "ms", "s"})
_NVML_VERSION = re.compile(r"NVML library version:\s*(\S+)")


class NvidiaSmiFailure(ParseError):
    """nvidia-smi printed a failure instead of a table; ``failure`` is :func:`find_failure`'s dict."""

    def __init__(self, failure: SmiFailure) -> None:
        self.failure = failure
        version = failure.get("nvml_library_version")
        detail = f" (NVML library version {version})" if version else ""
        super().__init__(f"nvidia-smi failed: {failure['message']}{detail}")


def find_failure(text: str) -> SmiFailure | None:
    """``{"kind", "message"[, "nvml_library_version"]}`` for a known nvidia-smi failure text, else None.

    ``kind`` is one of ``driver_library_mismatch``, ``driver_unreachable``, ``no_devices``,
    ``gpu_lost``, ``device_handle_error``, ``nvml_init_failed``; ``message`` is the line nvidia-smi printed.
    """
    lines = [line.strip() for line in text.splitlines()]
    for kind, needle in FAILURES:
        for line in lines:
            if needle in line:
                failure: SmiFailure = {"kind": kind, "message": line}
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
    header = _header(lines[0], fields)
    if header is not None:
        names = header
        if fields is not None and len(fields) != len(names):
            raise ParseError(f"the header has {len(names)} fields, the query {len(fields)}")
        rows = lines[1:]
        if not rows:
            # with no GPU, nvidia-smi prints no header but "No devices were found"
            raise ParseError(f"a header of {len(names)} fields and no GPU line after it")
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


def _header(line: str, fields: Sequence[str] | None) -> list[str] | None:
    """The field names of a header line, else None (the line is a GPU's values).

    A line of names is the header when one of them is a field nvidia-smi documents
    (:data:`~kimi_deploy.parsers.nvidia_smi_fields.QUERY_GPU_FIELDS`), a unit follows one, or they
    are the query's own ``fields``: a name not in the table (a newer driver's) is kept. A GPU's
    values never all look like names with one of them a documented field.
    """
    matches = [_HEADER_CELL.fullmatch(cell.strip()) for cell in line.split(",")]
    found = [m for m in matches if m]
    if len(found) != len(matches):
        return None
    names = [m.group("field") for m in found]
    asked = fields is not None and names == [field.strip() for field in fields]
    if asked or any(m.group("unit") for m in found) or any(name in QUERY_GPU_FIELDS for name in names):
        return names
    return None


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
