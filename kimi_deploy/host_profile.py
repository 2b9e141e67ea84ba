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
from collections.abc import Sequence
from typing import Any

from hostside.shared_queries import blocks, installed
from kimi_deploy.parsers import MAX_DIGITS, ParseError
from kimi_deploy.parsers.nvidia_smi_query import find_failure, parse_query
from kimi_deploy.parsers.nvidia_smi_topo import parse_topo
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci

DEFAULT_SMI_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version", "compute_cap")
SERVICES = ("nvidia-fabricmanager", "nvidia-imex")
# The packages of the profile: the driver's, the fabric manager's and IMEX's.
PACKAGES = ("nvidia-driver", "nvidia-fabricmanager", "nvidia-imex")
_RATE = re.compile(r"\s*(\d{1,20}(?:\.\d{1,20})?)\s*Gb/sec")
_KB = re.compile(r"\s*(\d{1,20})\s*kB\s*")
# sysfs's own forms: the PCI device folder's name and its vendor/device files.
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_PCI_ID = re.compile(r"0x[0-9a-fA-F]{4}")
_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")
_TOKEN = re.compile(r"[a-z0-9.]+")


def parse_profile(raw: dict[str, Any]) -> dict[str, Any]:
    """The HostProfile (shape in the module docstring) of one probe answer; never raises on a
    well-formed probe answer, whatever its sections hold."""
    errors: dict[str, str] = {}
    if raw.get("error"):
        errors["probe"] = str(raw["error"])
    sections = {}
    for name in ("nvidia", "tpu", "rdma", "host", "disk", "drivers"):
        section = raw.get(name)
        section = section if isinstance(section, dict) else {}
        if section.get("error"):
            errors[name] = str(section["error"])
        sections[name] = section
    host = sections["host"]
    return {
        "accelerators": _accelerators(sections["nvidia"], sections["tpu"], sections["drivers"], errors),
        "rdma": _rdma(sections["rdma"]),
        "memory": {
            "total_bytes": _kib(host.get("meminfo", {}).get("MemTotal")),
            "available_bytes": _kib(host.get("meminfo", {}).get("MemAvailable")),
        },
        # A kernel without NUMA shows no node directories: all its memory is one node.
        "numa_nodes": max(_count(host.get("numa_nodes")) or 0, 1),
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
    """Whether a profile's accelerator model is the recipe's ``wanted`` model.

    Case-insensitive, by whole words: "NVIDIA B300 SXM6 AC" is "B300" (and "NVIDIA B300") but not
    "GB300"; "NVIDIA GB300" is "GB300"; "NVIDIA H200 NVL" is "H200". TPUs compare by generation, with
    or without "TPU" and "v": "TPU7x", "TPU 7x", "7x" and "v7x" are one model, "TPU v5e" is not "v5p".
    """
    if not profile_model or not wanted.strip():
        return False
    if wanted.strip().lower().startswith("tpu") or profile_model.strip().lower().startswith("tpu"):
        return _tpu_generation(profile_model) == _tpu_generation(wanted)
    have, want = _tokens(profile_model), _tokens(wanted)
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def _tpu_generation(text: str) -> str:
    gen = re.sub(r"[\s_-]+", "", text.lower()).removeprefix("tpu")
    return gen.removeprefix("v")


def tpu_model(generation: str) -> str:
    """The model name of a TPU generation as Google writes it: "7x" -> "TPU7x", "v6e" -> "TPU v6e"."""
    return f"TPU {generation}" if generation.startswith("v") else f"TPU{generation}"


# Accelerators -----------------------------------------------------------------------------------


def _accelerators(
    nvidia: dict[str, Any], tpu: dict[str, Any], drivers: dict[str, Any], errors: dict[str, str]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "vendor": "none", "count": 0, "model": None, "memory_mib": None, "devices": [], "driver_version": None,
        "cuda_version": None, "source": None, "error": None, "topology": None, "nvlink_active": None,
        "fabric": None, "tpu": None,
    }  # fmt: skip
    nvml = nvidia.get("nvml")
    query = nvidia.get("smi_query")
    topo = nvidia.get("smi_topo")
    pci_gpus = (nvidia.get("pci_gpus") or {}).get("devices") or []
    devices: list[dict[str, Any]] | None = None
    if isinstance(nvml, dict) and isinstance(nvml.get("devices"), list) and "error" not in nvml:
        devices = [_nvml_device(d) for d in nvml["devices"]]
        out.update(
            source="nvml", driver_version=nvml.get("driver_version"), cuda_version=_cuda(nvml.get("cuda_version"))
        )
    elif isinstance(query, dict):
        devices, error = _smi_devices(query, nvidia.get("smi_fields") or DEFAULT_SMI_FIELDS)
        if devices is not None:
            out.update(source="nvidia-smi", driver_version=devices[0].pop("driver_version", None) if devices else None)
            for device in devices[1:]:
                device.pop("driver_version", None)
        else:
            out["error"] = error
    elif isinstance(nvml, dict) and nvml.get("error") and (topo is not None or drivers.get("proc_version")):
        # NVML failed and no nvidia-smi to fall back to, on a host with an NVIDIA driver.
        out["error"] = f"NVML: {nvml['error']}"
    nvidia_host = devices is not None or out["error"] is not None or topo is not None or bool(pci_gpus)
    if nvidia_host:
        out["vendor"] = "nvidia"
        if devices is None and out["error"] is None and pci_gpus:
            devices = [{"pci_address": d.get("address"), "device_id": d.get("device")} for d in pci_gpus]
            out["source"] = "sysfs"
        devices = devices or []
        names = {d.get("name") for d in devices}
        memories = [d["memory_mib"] for d in devices if isinstance(d.get("memory_mib"), int)]
        links = [d["nvlink_active"] for d in devices if isinstance(d.get("nvlink_active"), int)]
        fabric = [{"index": d.get("index"), **d["fabric"]} for d in devices if isinstance(d.get("fabric"), dict)]
        out.update(
            count=len(devices),
            devices=devices,
            model=names.pop() if len(names) == 1 else None,
            memory_mib=min(memories) if memories and len(memories) == len(devices) else None,
            nvlink_active=min(links) if links else None,
            fabric=fabric or None,
            topology=_topology(topo),
        )
        return out
    chips = _tpu(tpu, errors)
    if chips is not None:
        parsed, info = chips
        out.update(
            vendor="tpu", count=info["chip_count"], model=tpu_model(info["generation"]) if info["generation"] else None,
            devices=parsed["devices"], source="sysfs", tpu=info,
        )  # fmt: skip
    return out


def _nvml_device(device: dict[str, Any]) -> dict[str, Any]:
    keys = ("index", "name", "uuid", "memory_mib", "pci_bus_id", "compute_cap", "nvlink_active", "fabric")
    return {key: device.get(key) for key in keys}


def _cuda(version: Any) -> str | None:
    # NVML's CUDA driver version is major * 1000 + minor * 10: 13000 -> "13.0".
    if not isinstance(version, int) or version <= 0:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _smi_devices(query: dict[str, Any], fields: Sequence[str]) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The GPUs of a nvidia-smi query run, or None and why it gave none."""
    text = (query.get("stdout") or "") + (query.get("stderr") or "")
    failure = find_failure(text)
    if failure:
        return None, failure["message"]
    if query.get("error"):
        return None, f"nvidia-smi: {query['error']}"
    if query.get("rc") != 0:
        last = text.strip().splitlines()[-1:] or ["no output"]
        return None, f"nvidia-smi exited with status {query.get('rc')}: {last[0]}"
    try:
        rows = parse_query(query.get("stdout") or "", list(fields))
    except ParseError as exc:
        return None, f"nvidia-smi: {exc}"
    devices = []
    for row in rows:
        devices.append({
            "index": row.get("index"),
            "name": row.get("name"),
            "uuid": row.get("uuid"),
            "memory_mib": row.get("memory.total"),
            "pci_bus_id": row.get("pci.bus_id"),
            "compute_cap": None if row.get("compute_cap") is None else str(row.get("compute_cap")),
            "nvlink_active": None,
            "fabric": None,
            "driver_version": row.get("driver_version"),
        })  # fmt: skip
    return devices, None


def _topology(topo: Any) -> dict[str, Any] | None:
    if not isinstance(topo, dict) or topo.get("rc") != 0:
        return None
    try:
        return parse_topo(topo.get("stdout") or "")
    except ParseError:
        return None


def _tpu(tpu: dict[str, Any], errors: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    reported = tpu.get("pci")
    reported = reported if isinstance(reported, list) else []
    # Only entries in sysfs's form become lines of the listing: any other text could add lines.
    pci = [d for d in reported if _sysfs_pci(d)]
    if len(pci) < len(reported):
        errors["tpu.pci"] = f"{len(reported) - len(pci)} PCI entries not in sysfs's form (address, vendor, device)"
    if not pci:
        return None
    # The form parse_tpu_pci reads for sysfs: the address, then the vendor and device files.
    listing = "".join(f"{d['address']}\n  vendor: {d['vendor']}\n  device: {d['device']}\n" for d in pci)
    try:
        parsed = parse_tpu_pci(listing)
    except ParseError:
        return None
    if not parsed["chip_count"]:
        return None
    metadata = tpu.get("metadata") or {}
    worker = metadata.get("agent-worker-number")
    info = {
        "generation": parsed["generation"],
        "chip_count": parsed["chip_count"],
        "accelerator_type": metadata.get("accelerator-type") or None,
        "worker": _count(worker),
    }
    return parsed, info


def _sysfs_pci(device: Any) -> bool:
    if not isinstance(device, dict):
        return False
    address, vendor, number = device.get("address"), device.get("vendor"), device.get("device")
    return (
        isinstance(address, str)
        and isinstance(vendor, str)
        and isinstance(number, str)
        and bool(_PCI_ADDRESS.fullmatch(address) and _PCI_ID.fullmatch(vendor) and _PCI_ID.fullmatch(number))
    )


def _count(value: Any) -> int | None:
    """A non-negative count a host reported, as an int or as digits; None for anything else."""
    if isinstance(value, str) and value.strip().isdecimal() and len(value.strip()) <= MAX_DIGITS:
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MAX_DIGITS:
        return value
    return None


# The rest ---------------------------------------------------------------------------------------


def _rdma(rdma: dict[str, Any]) -> list[dict[str, Any]]:
    ports = []
    for port in rdma.get("ports") or []:
        number = str(port.get("port", ""))
        rate = _RATE.match(port.get("rate") or "")
        ports.append({
            "device": port.get("device"),
            "port": _count(number) if number.isdecimal() else number,
            "state": _sysfs_state(port.get("state")),
            "phys_state": _sysfs_state(port.get("phys_state")),
            "rate_gbps": (float(rate.group(1)) if "." in rate.group(1) else int(rate.group(1))) if rate else None,
            "link_layer": port.get("link_layer"),
        })  # fmt: skip
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
