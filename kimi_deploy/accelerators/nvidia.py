"""NVIDIA GPUs: the driver stack the drivers step installs, NVML's and nvidia-smi's view of the
devices, NCCL's collectives and the watchdog's health queries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kimi_deploy.accelerators import nvidia_drivers
from kimi_deploy.accelerators.interface import AcceleratorKind
from kimi_deploy.accelerators.nvidia_models import open_modules_only
from kimi_deploy.parsers import ParseError
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


def _profile(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> dict[str, Any] | None:
    """The GPUs NVML reports, else nvidia-smi's query, else the NVIDIA devices on PCI (no driver
    answering); None on a host with no sign of an NVIDIA GPU or driver."""
    nvidia, drivers = sections.get("nvidia") or {}, sections.get("drivers") or {}
    out: dict[str, Any] = {"source": None, "error": None, "driver_version": None}
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
    if devices is None and out["error"] is None and topo is None and not pci_gpus:
        return None
    if devices is None and out["error"] is None and pci_gpus:
        devices = [{"pci_address": d.get("address"), "device_id": d.get("device")} for d in pci_gpus]
        out["source"] = "sysfs"
    devices = devices or []
    names = {d.get("name") for d in devices}
    memories = [d["memory_mib"] for d in devices if isinstance(d.get("memory_mib"), int)]
    links = [d["nvlink_active"] for d in devices if isinstance(d.get("nvlink_active"), int)]
    fabric = [{"index": d.get("index"), **d["fabric"]} for d in devices if isinstance(d.get("fabric"), dict)]
    out.update(
        vendor=NAME,
        count=len(devices),
        devices=devices,
        model=names.pop() if len(names) == 1 else None,
        memory_mib=min(memories) if memories and len(memories) == len(devices) else None,
        nvlink_active=min(links) if links else None,
        fabric=fabric or None,
        topology=_topology(topo),
    )
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
    return [
        {
            "index": row.get("index"),
            "name": row.get("name"),
            "uuid": row.get("uuid"),
            "memory_mib": row.get("memory.total"),
            "pci_bus_id": row.get("pci.bus_id"),
            "compute_cap": None if row.get("compute_cap") is None else str(row.get("compute_cap")),
            "nvlink_active": None,
            "fabric": None,
            "driver_version": row.get("driver_version"),
        }
        for row in rows
    ], None


def _topology(topo: Any) -> dict[str, Any] | None:
    if not isinstance(topo, dict) or topo.get("rc") != 0:
        return None
    try:
        return parse_topo(topo.get("stdout") or "")
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
    driver_line=nvidia_drivers.host_line,
)
