"""NVIDIA GPUs: the driver stack the drivers step installs, NVML's and nvidia-smi's view of the
devices, NCCL's collectives and the watchdog's health queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kimi_deploy.accelerators import nvidia_drivers
from kimi_deploy.accelerators.interface import AcceleratorKind
from kimi_deploy.accelerators.nvidia_models import open_modules_only
from kimi_deploy.host.profile_types import Accelerators, Device, Fabric, Topology, no_accelerators
from kimi_deploy.parsers import ParseError, count_of, text_of
from kimi_deploy.parsers.nvidia_smi_query import find_failure, parse_query
from kimi_deploy.parsers.nvidia_smi_topo import parse_topo

if TYPE_CHECKING:
    from kimi_deploy.recipe import Recipe

NAME = "nvidia"
# What the probe asks nvidia-smi of each GPU where NVML does not answer.
DEFAULT_SMI_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version", "compute_cap")
# Accelerator models whose hosts are Arm (Grace) machines.
ARM_MODELS = frozenset({"GB200", "GB300"})


def _recipe_rule(recipe: Recipe, topology: str) -> str | None:
    acc = recipe.topologies[topology].accelerators
    want = recipe.drivers.nvidia
    if want is None:
        return "nvidia hosts need drivers.nvidia pinned"
    if want.flavor != "open" and open_modules_only(acc.model or ""):
        return (
            f"{acc.model} GPUs run only NVIDIA's open kernel modules: "
            f"set drivers.nvidia.flavor to open, found {want.flavor}"
        )
    return None


def _machine(model: str | None) -> str:
    return "aarch64" if (model or "").upper() in ARM_MODELS else "x86_64"


def _profile(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> Accelerators | None:
    """The GPUs NVML reports, else nvidia-smi's query, else the NVIDIA devices on PCI (no driver
    answering); None on a host with no sign of an NVIDIA GPU or driver."""
    nvidia, drivers = sections.get("nvidia") or {}, sections.get("drivers") or {}
    out = no_accelerators(NAME)
    nvml = nvidia.get("nvml")
    query = nvidia.get("smi_query")
    topo = nvidia.get("smi_topo")
    pci = nvidia.get("pci_gpus")
    pci_gpus = pci.get("devices") if isinstance(pci, dict) else None
    pci_gpus = [d for d in pci_gpus if isinstance(d, dict)] if isinstance(pci_gpus, list) else []
    devices: list[Device] | None = None
    if isinstance(nvml, dict) and isinstance(nvml.get("devices"), list) and "error" not in nvml:
        devices = [_nvml_device(d) for d in nvml["devices"] if isinstance(d, dict)]
        out.update(
            {
                "source": "nvml",
                "driver_version": text_of(nvml.get("driver_version")),
                "cuda_version": _cuda(nvml.get("cuda_version")),
            }
        )
    elif isinstance(query, dict):
        fields = nvidia.get("smi_fields")
        fields = fields if isinstance(fields, list) and all(isinstance(f, str) for f in fields) else None
        found, error = _smi_devices(query, fields or DEFAULT_SMI_FIELDS)
        if found is not None:
            devices = [device for device, _ in found]
            out.update({"source": "nvidia-smi", "driver_version": found[0][1] if found else None})
        else:
            out["error"] = error
    elif isinstance(nvml, dict) and nvml.get("error") and (topo is not None or drivers.get("proc_version")):
        # NVML failed and no nvidia-smi to fall back to, on a host with an NVIDIA driver.
        out["error"] = f"NVML: {nvml['error']}"
    if devices is None and out["error"] is None and topo is None and not pci_gpus:
        return None
    if devices is None and out["error"] is None and pci_gpus:
        devices = [{"pci_address": text_of(d.get("address")), "device_id": text_of(d.get("device"))} for d in pci_gpus]
        out["source"] = "sysfs"
    devices = devices or []
    names = {d.get("name") for d in devices}
    memories = [m for d in devices if (m := d.get("memory_mib")) is not None]
    links = [n for d in devices if (n := d.get("nvlink_active")) is not None]
    fabric: list[Fabric] = [{"index": d.get("index"), **f} for d in devices if (f := d.get("fabric")) is not None]
    out.update(
        {
            "vendor": NAME,
            "count": len(devices),
            "devices": devices,
            "model": names.pop() if len(names) == 1 else None,
            "memory_mib": min(memories) if memories and len(memories) == len(devices) else None,
            "nvlink_active": min(links) if links else None,
            "fabric": fabric or None,
            "topology": _topology(topo),
        }
    )
    return out


def _fabric(value: Any) -> Fabric | None:
    """A GPU's fabric as NVML reports it (``hostside/hardware_probe.py``), its values checked."""
    if not isinstance(value, dict):
        return None
    return {
        "cluster_uuid": text_of(value.get("cluster_uuid")),
        "clique_id": count_of(value.get("clique_id")),
        "state": text_of(value.get("state")),
        "status": count_of(value.get("status")),
    }


def _nvml_device(device: Mapping[str, Any]) -> Device:
    return {
        "index": count_of(device.get("index")),
        "name": text_of(device.get("name")),
        "uuid": text_of(device.get("uuid")),
        "memory_mib": count_of(device.get("memory_mib")),
        "pci_bus_id": text_of(device.get("pci_bus_id")),
        "compute_cap": text_of(device.get("compute_cap")),
        "nvlink_active": count_of(device.get("nvlink_active")),
        "fabric": _fabric(device.get("fabric")),
    }


def _cuda(version: Any) -> str | None:
    # NVML's CUDA driver version is major * 1000 + minor * 10: 13000 -> "13.0".
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _smi_devices(
    query: Mapping[str, Any], fields: Sequence[str]
) -> tuple[list[tuple[Device, str | None]] | None, str | None]:
    """The GPUs of a nvidia-smi query run, each with the driver version its row prints, or None
    and why it gave none."""
    stdout, stderr = text_of(query.get("stdout")) or "", text_of(query.get("stderr")) or ""
    failure = find_failure(stdout + stderr)
    if failure:
        return None, failure["message"]
    if query.get("error"):
        return None, f"nvidia-smi: {query['error']}"
    if query.get("rc") != 0:
        last = (stdout + stderr).strip().splitlines()[-1:] or ["no output"]
        return None, f"nvidia-smi exited with status {query.get('rc')}: {last[0]}"
    try:
        rows = parse_query(stdout, list(fields))
    except ParseError as exc:
        return None, f"nvidia-smi: {exc}"
    return [
        (
            {
                "index": count_of(row.get("index")),
                "name": text_of(row.get("name")),
                "uuid": text_of(row.get("uuid")),
                "memory_mib": count_of(row.get("memory.total")),
                "pci_bus_id": text_of(row.get("pci.bus_id")),
                "compute_cap": None if row.get("compute_cap") is None else str(row.get("compute_cap")),
                "nvlink_active": None,
                "fabric": None,
            },
            text_of(row.get("driver_version")),
        )
        for row in rows
    ], None


def _topology(topo: Any) -> Topology | None:
    if not isinstance(topo, dict) or topo.get("rc") != 0:
        return None
    try:
        return parse_topo(text_of(topo.get("stdout")) or "")
    except ParseError:
        return None


KIND = AcceleratorKind(
    name=NAME,
    probe_sections=("nvidia",),
    gloo=True,
    nccl=True,
    memory_reported=True,
    device_health=True,
    recipe_rule=_recipe_rule,
    machine=_machine,
    read_profile=_profile,
    drivers_request=nvidia_drivers.probe_request,
    plan_drivers=nvidia_drivers.plan_drivers,
    driver_files=nvidia_drivers.driver_files,
    driver_line=nvidia_drivers.host_line,
)
