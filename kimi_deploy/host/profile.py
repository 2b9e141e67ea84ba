"""A host's hardware profile, made from the raw JSON of ``hostside/hardware_probe.py``.

:func:`parse_profile` returns a ``HostProfile`` (``kimi_deploy.host.profile_types``), a plain JSON-able
dict with every key always present::

    {"accelerators": {
         "vendor": "nvidia" | "tpu" | "none",
         "count": 8,                              # GPUs or TPU chips; 0 when the driver failed
         "model": "NVIDIA B300 SXM6 AC",          # "TPU7x", "TPU v6e"; None if unknown or mixed
         "memory_mib": 275040,                    # the smallest device's; None for TPUs and sysfs
         "devices": [{"index": 0, "name": ..., "uuid": ..., "memory_mib": 275040,
                      "pci_bus_id": "00000000:1A:00.0", "compute_cap": "10.3",
                      "nvlink_active": 18 | None, "fabric": {...} | None}, ...],
                    # TPU: [{"pci_address", "vendor_id", "device_id", "generation", "iommu_group"}]
                    # sysfs (no driver answered): [{"pci_address", "device_id"}]
         "driver_version": "580.95.05" | None,
         "cuda_version": "13.0" | None,           # NVML only
         "source": "nvml" | "nvidia-smi" | "sysfs" | None,
         "error": "Failed to initialize NVML: Driver/library version mismatch" | None,
         "topology": parse_topo(...) | None,      # nvidia-smi topo -m, see kimi_deploy.parsers
         "nvlink_active": 18 | None,              # fewest active NVLinks of any GPU (NVML only)
         "fabric": [{"index", "cluster_uuid", "clique_id", "state", "status"}] | None,  # GB200/GB300
         "tpu": {"generation": "7x", "chip_count": 4, "accelerator_type": "tpu7x-128" | None,
                 "worker": 0 | None} | None},
     "rdma": [{"device": "mlx5_0", "port": 1, "state": "ACTIVE", "phys_state": "LinkUp",
               "rate_gbps": 400, "link_layer": "InfiniBand"}],
     "memory": {"total_bytes": int | None, "available_bytes": int | None},
     "numa_nodes": 2,
     "cpu": {"model": "AMD EPYC 9654 96-Core Processor" | None, "count": 384 | None},
     "os": {"id": "debian", "version_id": "12", "pretty": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0-26-amd64"},
     "disk": {"path": "/srv/models", "fs_type": "xfs", "total_bytes": int, "free_bytes": int,
              "read_mb_s": 540.2 | None},          # MB = 10**6 bytes; None unless measured
     "drivers": {"nvidia": "580.95.05" | None,   # the loaded kernel module's
                 "packages": {"nvidia-fabricmanager-580": "580.95.05-1", ...},   # installed only
                 "fabricmanager_active": "active" | "inactive" | ... | None,     # None: no systemd
                 "imex_active": ... | None},
     "errors": {"disk": "PermissionError: ...", ...}}   # what the probe could not read, per section

``accelerators.error`` is set when the host has an NVIDIA driver stack that does not answer (its
failure text, or NVML's error when nvidia-smi is absent); then ``count`` is 0 and ``source`` None. A
host whose NVIDIA GPUs sit on PCI with no driver answering reads as vendor ``nvidia``, source
``sysfs``, model None. ``free_bytes`` is what an unprivileged writer may use (``f_bavail``).

What a host reports is read as data, never trusted: a TPU PCI entry whose address, vendor or device
is not in sysfs's form is left out (``errors["tpu.pci"]`` says how many), and numbers longer than
any hardware prints read as unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kimi_deploy.accelerators import KINDS, NONE
from kimi_deploy.host.profile_types import Accelerators, Disk, Drivers, HostProfile, RdmaPort, no_accelerators
from kimi_deploy.hostside.shared_queries import blocks, installed
from kimi_deploy.parsers import count_of, text_of

SERVICES = ("nvidia-fabricmanager", "nvidia-imex")
# The packages of the profile: the driver's, the fabric manager's and IMEX's.
PACKAGES = ("nvidia-driver", "nvidia-fabricmanager", "nvidia-imex")
_RATE = re.compile(r"\s*(\d{1,20}(?:\.\d{1,20})?)\s*Gb/sec")
_KB = re.compile(r"\s*(\d{1,20})\s*kB\s*")
_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")


def parse_profile(raw: Mapping[str, Any]) -> HostProfile:
    """The HostProfile (shape in the module docstring) of one probe answer; never raises on a
    well-formed probe answer, whatever its sections hold: a value of another type than the
    record's reads as unknown (None)."""
    errors: dict[str, str] = {}
    if raw.get("error"):
        errors["probe"] = str(raw["error"])
    # the probe's sections: JSON objects as the host sent them, read below into the record
    sections: dict[str, Mapping[str, Any]] = {}
    kinds = [name for kind in KINDS.values() for name in kind.probe_sections]
    for name in (*kinds, "rdma", "host", "disk", "drivers"):
        section = raw.get(name)
        section = section if isinstance(section, dict) else {}
        if section.get("error"):
            errors[name] = str(section["error"])
        sections[name] = section
    host = sections["host"]
    meminfo = _object(host.get("meminfo"))
    os_release = _object(host.get("os_release"))
    return {
        "accelerators": _accelerators(sections, errors),
        "rdma": _rdma(sections["rdma"]),
        "memory": {
            "total_bytes": _kib(meminfo.get("MemTotal")),
            "available_bytes": _kib(meminfo.get("MemAvailable")),
        },
        # A kernel without NUMA shows no node directories: all its memory is one node.
        "numa_nodes": max(count_of(host.get("numa_nodes")) or 0, 1),
        "cpu": {"model": text_of(host.get("cpu_model")), "count": count_of(host.get("cpu_count"))},
        "os": {
            "id": text_of(os_release.get("ID")),
            "version_id": text_of(os_release.get("VERSION_ID")),
            "pretty": text_of(os_release.get("PRETTY_NAME")),
            "kernel": text_of(host.get("kernel")),
            "python": text_of(host.get("python")),
        },
        "disk": _disk(sections["disk"], errors),
        "drivers": _drivers(sections["drivers"]),
        "errors": errors,
    }


def matches_model(profile_model: str | None, wanted: str) -> bool:
    """Whether a profile's accelerator model is the recipe's ``wanted`` model, by the rule of any
    accelerator kind (``AcceleratorKind.matches_model``): "NVIDIA B300 SXM6 AC" is "B300" but not
    "GB300"; "TPU7x", "TPU 7x", "7x" and "v7x" are one TPU model."""
    return any(kind.matches_model(profile_model, wanted) for kind in KINDS.values())


def _object(value: Any) -> Mapping[str, Any]:
    """A JSON object of the answer, or an empty one for anything else."""
    return value if isinstance(value, dict) else {}


def _accelerators(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> Accelerators:
    """The first kind's devices the probe found (``KINDS``, in order), on every key of the shape."""
    for kind in KINDS.values():
        found = kind.read_profile(sections, errors)
        if found is not None:
            return found
    return no_accelerators(NONE.name)


# The rest ---------------------------------------------------------------------------------------


def _rdma(rdma: Mapping[str, Any]) -> list[RdmaPort]:
    ports: list[RdmaPort] = []
    listed = rdma.get("ports")
    for port in listed if isinstance(listed, list) else []:
        if not isinstance(port, dict):
            continue
        number = port.get("port", "")
        number = str(number) if isinstance(number, int | str) and not isinstance(number, bool) else ""
        rate = _RATE.match(text_of(port.get("rate")) or "")
        ports.append(
            {
                "device": text_of(port.get("device")),
                "port": count_of(number) if number.isdecimal() else (number or None),
                "state": _sysfs_state(text_of(port.get("state"))),
                "phys_state": _sysfs_state(text_of(port.get("phys_state"))),
                "rate_gbps": (float(rate.group(1)) if "." in rate.group(1) else int(rate.group(1))) if rate else None,
                "link_layer": text_of(port.get("link_layer")),
            }
        )
    return ports


def port_active(port: RdmaPort) -> bool:
    """Whether an RDMA port of the profile is active (``ACTIVE``, or ``ACTIVE_DEFER``)."""
    return "ACTIVE" in (port["state"] or "").upper()


def _sysfs_state(value: str | None) -> str | None:
    # "4: ACTIVE" -> "ACTIVE"; split by hand, a lazy pattern backtracks over a long text.
    if value is None:
        return None
    code, colon, state = value.partition(":")
    return state.strip() if colon and code.strip().isdecimal() else value.strip()


def _kib(value: Any) -> int | None:
    match = _KB.fullmatch(text_of(value) or "")
    return int(match.group(1)) * 1024 if match else None


def _disk(disk: Mapping[str, Any], errors: dict[str, str]) -> Disk:
    read = disk.get("read")
    read_mb_s = None
    if isinstance(read, dict):
        if read.get("error"):
            errors["disk.read"] = str(read["error"])
        elif read.get("bytes") and read.get("seconds"):
            try:
                read_mb_s = round(read["bytes"] / 1e6 / read["seconds"], 1)
            except (ArithmeticError, TypeError):  # a number past a float, or not a number
                errors["disk.read"] = "the read measurement is not a number of bytes and seconds"
    return {
        "path": text_of(disk.get("path")),
        "fs_type": text_of(disk.get("fs_type")),
        "total_bytes": count_of(disk.get("total_bytes")),
        "free_bytes": count_of(disk.get("free_bytes")),
        "read_mb_s": read_mb_s,
    }


def _drivers(drivers: Mapping[str, Any]) -> Drivers:
    version = _NVRM.search(text_of(drivers.get("proc_version")) or "")
    dpkg = drivers.get("dpkg")
    found = installed(text_of(dpkg.get("stdout")) or "") if isinstance(dpkg, dict) else {}
    # the probe asks for every nvidia-* package (the drivers step's query); the profile keeps these
    packages = {name: p["version"] for name, p in found.items() if name.startswith(PACKAGES)}
    active: dict[str, str | None] = dict.fromkeys(SERVICES)
    services = drivers.get("services")
    if isinstance(services, dict):
        # ``systemctl show``'s blocks (no systemd: none names a unit)
        for props in blocks(text_of(services.get("stdout")) or ""):
            unit = props.get("Id", "").removesuffix(".service")
            if unit in active and props.get("ActiveState"):
                active[unit] = props["ActiveState"]
    return {
        "nvidia": version.group(1) if version else None,
        "packages": packages,
        "fabricmanager_active": active["nvidia-fabricmanager"],
        "imex_active": active["nvidia-imex"],
    }
