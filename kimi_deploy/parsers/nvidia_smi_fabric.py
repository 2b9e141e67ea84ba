"""Parse the ``Fabric`` sections of ``nvidia-smi -q``: each GPU's NVLink fabric state.

:func:`parse_fabric` returns one dict per ``Fabric`` section, in output order::

    [{"gpu": "00000000:19:00.0", "state": "Completed", "status": "Success", "clique_id": 2,
      "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
      "health": {"Summary": "Unhealthy", "Bandwidth": "Full"}, "ready": False}, ...]

- ``gpu``: the bus id of the ``GPU 00000000:19:00.0`` heading the section is under; None when the
  text holds the section alone (``nvidia-smi -q | grep -A5 Fabric``).
- ``state``, ``status``, ``cluster_uuid``: as printed; ``clique_id`` an int. A value nvidia-smi
  prints as ``N/A`` is None, as is a line an older driver does not print (535 prints the state and
  the status alone).
- ``health``: the ``Health`` subsection's lines (drivers 570 and later), names as printed.
- ``ready``: the GPU has joined its NVLink domain: ``State`` ``Completed`` with ``Status``
  ``Success``, and no ``Health`` ``Summary`` of ``Unhealthy``. ``In Progress`` (the fabric manager
  or the switch trays not done yet) and ``Completed`` with a failure status (``Insufficient
  Resources``) are not ready; neither is a healthy-looking state whose health summary says otherwise.

The same keys as the probe's NVML read (``hostside/hardware_probe.py``), from the text a user pastes.
A failure text instead of the report raises :class:`~kimi_deploy.parsers.nvidia_smi_query.NvidiaSmiFailure`;
text without a ``Fabric`` section raises :class:`~kimi_deploy.parsers.ParseError`.
"""

from __future__ import annotations

import re
from typing import Literal, TypedDict

from kimi_deploy.parsers import ParseError, read_int
from kimi_deploy.parsers.nvidia_smi_query import NvidiaSmiFailure, find_failure


class FabricSection(TypedDict):
    """A ``Fabric`` section: a GPU's NVLink fabric state (shape in the module docstring)."""

    gpu: str | None
    state: str | None
    status: str | None
    clique_id: int | None
    cluster_uuid: str | None
    # the Health subsection's names as printed -> their values, None for N/A
    health: dict[str, str | None]
    ready: bool


_GPU_HEADING = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")
# The lines kept as printed, by name -> key; CliqueId, a number, is the other line read.
_TEXT: dict[str, Literal["state", "status", "cluster_uuid"]] = {
    "State": "state",
    "Status": "status",
    "ClusterUUID": "cluster_uuid",
}


def parse_fabric(text: str) -> list[FabricSection]:
    """The ``Fabric`` sections of ``nvidia-smi -q`` output (shape in the module docstring)."""
    failure = find_failure(text)
    if failure:
        raise NvidiaSmiFailure(failure)
    sections: list[FabricSection] = []
    gpu: str | None = None
    section: FabricSection | None = None
    indent = health = -1
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        depth = len(line) - len(line.lstrip())
        heading = _GPU_HEADING.fullmatch(stripped)
        if heading:
            gpu, section = heading.group(1), None
            continue
        if stripped == "Fabric":
            # ready is decided once the section is read
            section = {
                "gpu": gpu,
                "state": None,
                "status": None,
                "clique_id": None,
                "cluster_uuid": None,
                "health": {},
                "ready": False,
            }
            sections.append(section)
            indent, health = depth, -1
            continue
        if section is None:
            continue
        if not stripped or depth <= indent:
            section = None  # the section ends where its indentation does
            continue
        if stripped == "Health":
            health = depth
            continue
        key, colon, value = stripped.partition(":")
        key, value = key.strip(), value.strip()
        if not colon:
            raise ParseError(f"line {number}: {stripped!r} in a Fabric section is not 'name : value'")
        if health >= 0 and depth > health:
            section["health"][key] = None if value == "N/A" else value
        elif key in _TEXT:
            health = -1
            section[_TEXT[key]] = None if value == "N/A" else value
        elif key == "CliqueId":
            health = -1
            section["clique_id"] = _clique_id(value, number)
    if not sections:
        raise ParseError("no 'Fabric' section (nvidia-smi -q prints one under each GPU)")
    for section in sections:
        unhealthy = section["health"].get("Summary") == "Unhealthy"
        section["ready"] = section["state"] == "Completed" and section["status"] == "Success" and not unhealthy
    return sections


def _clique_id(value: str, number: int) -> int | None:
    if value == "N/A":
        return None
    if not value.isdigit():
        raise ParseError(f"line {number}: CliqueId {value!r} is not a number")
    return read_int(value, f"line {number}: CliqueId")
