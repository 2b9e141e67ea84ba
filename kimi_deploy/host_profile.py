"""A host's hardware profile, made from the raw JSON of ``hostside/hardware_probe.py``.

:func:`parse_profile` returns a plain JSON-able dict (every key always present)::

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
from kimi_deploy.hostside.shared_queries import blocks, installed
from kimi_deploy.parsers import count_of

SERVICES = ("nvidia-fabricmanager", "nvidia-imex")
# The packages of the profile: the driver's, the fabric manager's and IMEX's.
PACKAGES = ("nvidia-driver", "nvidia-fabricmanager", "nvidia-imex")
_RATE = re.compile(r"\s*(\d{1,20}(?:\.\d{1,20})?)\s*Gb/sec")
_KB = re.compile(r"\s*(\d{1,20})\s*kB\s*")
_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")


def parse_profile(raw: dict[str, Any]) -> dict[str, Any]:
    """The HostProfile (shape in the module docstring) of one probe answer; never raises on a
    well-formed probe answer, whatever its sections hold."""
    errors: dict[str, str] = {}
    if raw.get("error"):
        errors["probe"] = str(raw["error"])
    sections: dict[str, dict[str, Any]] = {}
    kinds = [name for kind in KINDS.values() for name in kind.probe_sections]
    for name in (*kinds, "rdma", "host", "disk", "drivers"):
        section = raw.get(name)
        section = section if isinstance(section, dict) else {}
        if section.get("error"):
            errors[name] = str(section["error"])
        sections[name] = section
    host = sections["host"]
    return {
        "accelerators": _accelerators(sections, errors),
        "rdma": _rdma(sections["rdma"]),
        "memory": {
            "total_bytes": _kib(host.get("meminfo", {}).get("MemTotal")),
            "available_bytes": _kib(host.get("meminfo", {}).get("MemAvailable")),
        },
        # A kernel without NUMA shows no node directories: all its memory is one node.
        "numa_nodes": max(count_of(host.get("numa_nodes")) or 0, 1),
        "cpu": {"model": host.get("cpu_model"), "count": host.get("cpu_count")},
        "os": {
            "id": host.get("os_release", {}).get("ID"),
            "version_id": host.get("os_release", {}).get("VERSION_ID"),
            "pretty": host.get("os_release", {}).get("PRETTY_NAME"),
            "kernel": host.get("kernel"),
            "python": host.get("python"),
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


def _accelerators(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> dict[str, Any]:
    """The first kind's devices the probe found (``KINDS``, in order), on every key of the shape."""
    out: dict[str, Any] = {
        "vendor": NONE.name,
        "count": 0,
        "model": None,
        "memory_mib": None,
        "devices": [],
        "driver_version": None,
        "cuda_version": None,
        "source": None,
        "error": None,
        "topology": None,
        "nvlink_active": None,
        "fabric": None,
        "tpu": None,
    }
    for kind in KINDS.values():
        found = kind.read_profile(sections, errors)
        if found is not None:
            return out | found
    return out


# The rest ---------------------------------------------------------------------------------------


def _rdma(rdma: dict[str, Any]) -> list[dict[str, Any]]:
    ports = []
    for port in rdma.get("ports") or []:
        number = str(port.get("port", ""))
        rate = _RATE.match(port.get("rate") or "")
        ports.append(
            {
                "device": port.get("device"),
                "port": count_of(number) if number.isdecimal() else number,
                "state": _sysfs_state(port.get("state")),
                "phys_state": _sysfs_state(port.get("phys_state")),
                "rate_gbps": (float(rate.group(1)) if "." in rate.group(1) else int(rate.group(1))) if rate else None,
                "link_layer": port.get("link_layer"),
            }
        )
    return ports


def port_active(port: dict[str, Any]) -> bool:
    """Whether an RDMA port of the profile is active (``ACTIVE``, or ``ACTIVE_DEFER``)."""
    return "ACTIVE" in str(port.get("state") or "").upper()


def _sysfs_state(value: str | None) -> str | None:
    # "4: ACTIVE" -> "ACTIVE"; split by hand, a lazy pattern backtracks over a long text.
    if value is None:
        return None
    code, colon, state = value.partition(":")
    return state.strip() if colon and code.strip().isdecimal() else value.strip()


def _kib(value: str | None) -> int | None:
    match = _KB.fullmatch(value or "")
    return int(match.group(1)) * 1024 if match else None


def _disk(disk: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
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
        "path": disk.get("path"),
        "fs_type": disk.get("fs_type"),
        "total_bytes": disk.get("total_bytes"),
        "free_bytes": disk.get("free_bytes"),
        "read_mb_s": read_mb_s,
    }


def _drivers(drivers: dict[str, Any]) -> dict[str, Any]:
    version = _NVRM.search(drivers.get("proc_version") or "")
    dpkg = drivers.get("dpkg")
    found = installed(dpkg.get("stdout") or "") if isinstance(dpkg, dict) else {}
    # the probe asks for every nvidia-* package (the drivers step's query); the profile keeps these
    packages = {name: p["version"] for name, p in found.items() if name.startswith(PACKAGES)}
    active: dict[str, str | None] = dict.fromkeys(SERVICES)
    services = drivers.get("services")
    if isinstance(services, dict):
        # ``systemctl show``'s blocks (no systemd: none names a unit)
        for props in blocks(services.get("stdout") or ""):
            unit = props.get("Id", "").removesuffix(".service")
            if unit in active and props.get("ActiveState"):
                active[unit] = props["ActiveState"]
    return {
        "nvidia": version.group(1) if version else None,
        "packages": packages,
        "fabricmanager_active": active["nvidia-fabricmanager"],
        "imex_active": active["nvidia-imex"],
    }
