"""Google TPUs: chips found on PCI (their runtime, libtpu, comes with the engine's release), the
kernel settings their runtime needs, and JAX's count of devices per chip."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from kimi_deploy.accelerators.interface import AcceleratorKind, DriversPlan, DriversStep, SysctlPlan, matches_words
from kimi_deploy.host.profile_types import Accelerators, Device, TpuInfo, no_accelerators
from kimi_deploy.hostside.requests import DriversRequest
from kimi_deploy.parsers import ParseError, count_of, text_of
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci
from kimi_deploy.render.files import RenderedFile

if TYPE_CHECKING:
    from kimi_deploy.plan.servespec import HostPlan
    from kimi_deploy.recipe import Recipe

NAME = "tpu"
# The TPU runtime a TPU engine loads (jax[tpu] requires it: jax 0.10.2 takes libtpu 0.0.42.*).
TPU_RUNTIME = "libtpu"
# The kernel's default (65530) caps the memory mappings of a process; the TPU runtime maps far more.
# 8388608 is what vLLM's TPU backend sets on v7x hosts, "Required to prevent vLLM crashes due to
# memory mapping limits" (vllm-project/tpu-inference .buildkite/kubernetes/manifests/v7x/
# single_decode.yaml:51-53, commit b8692ff0); sglang-jax's documents name no value.
TPU_SYSCTL_FILE = "/etc/sysctl.d/60-kimi-tpu.conf"
TPU_SYSCTL = {"vm.max_map_count": "8388608"}
# How many devices JAX counts on one chip, by accelerators.model (any case). A TPU7x (Ironwood)
# chip has two TensorCores, and JAX shows each as a device of its own ("Each TPU7x chip contains
# two TensorCores", "access two TPU devices instead of the single logical core":
# https://cloud.google.com/tpu/docs/tpu7x, "Dual-chiplet architecture"; sglang-jax's
# docs/cookbook/base/tpu-topology-reference.md: v7x, 2 JAX devices per chip, ``--tp-size`` = the
# JAX devices of all nodes). Any generation not named here is one device a chip.
DEVICES_PER_CHIP = {"tpu7x": 2}
# sysfs's own forms: the PCI device folder's name and its vendor/device files.
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_PCI_ID = re.compile(r"0x[0-9a-fA-F]{4}")


def tpu_model(generation: str) -> str:
    """The model name of a TPU generation as Google writes it: "7x" -> "TPU7x", "v6e" -> "TPU v6e"."""
    return f"TPU {generation}" if generation.startswith("v") else f"TPU{generation}"


def _generation(text: str) -> str:
    gen = re.sub(r"[\s_-]+", "", text.lower()).removeprefix("tpu")
    return gen.removeprefix("v")


def matches_model(profile_model: str | None, wanted: str) -> bool:
    """TPUs compare by generation, with or without "TPU" and "v": "TPU7x", "TPU 7x", "7x" and
    "v7x" are one model, "TPU v5e" is not "v5p"."""
    if not profile_model or not wanted.strip():
        return False
    if wanted.strip().lower().startswith("tpu") or profile_model.strip().lower().startswith("tpu"):
        return _generation(profile_model) == _generation(wanted)
    return matches_words(profile_model, wanted)


def _recipe_rule(recipe: Recipe, topology: str) -> str | None:
    engine = recipe.topologies[topology].engine
    if TPU_RUNTIME in recipe.engines[engine].packages:
        return None
    return (
        "tpu hosts run the TPU runtime of their engine's release: "
        f"pin {TPU_RUNTIME} (with the jax and jaxlib it was built for) under engines.{engine}.packages"
    )


def _devices(model: str | None) -> int:
    return DEVICES_PER_CHIP.get((model or "").lower(), 1)


def _profile(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> Accelerators | None:
    tpu = sections.get("tpu") or {}
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
    metadata = tpu.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    info: TpuInfo = {
        "generation": parsed["generation"],
        "chip_count": parsed["chip_count"],
        "accelerator_type": text_of(metadata.get("accelerator-type")) or None,
        "worker": count_of(metadata.get("agent-worker-number")),
    }
    model = tpu_model(info["generation"]) if info["generation"] else None
    found = no_accelerators(NAME)
    found.update(
        {
            "vendor": NAME,
            "count": info["chip_count"],
            "model": model,
            # five of Device's keys (iommu_group None: the listing names no group); a cast, as mypy
            # cannot widen a list of one TypedDict to another's
            "devices": cast(list[Device], parsed["devices"]),
            "source": "sysfs",
            "tpu": info,
        }
    )
    return found


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


def _drivers_request(recipe: Recipe, spec: HostPlan) -> DriversRequest:
    return {"files": [TPU_SYSCTL_FILE], "sysctl": sorted(TPU_SYSCTL)}


def _driver_files(recipe: Recipe, spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[RenderedFile, ...]:
    content = "".join(f"{key} = {value}\n" for key, value in sorted(TPU_SYSCTL.items()))
    why = "# Host settings TPU serving needs, from kimi-deploy.\n"
    return (RenderedFile(TPU_SYSCTL_FILE, why + content, 0o644, "root"),)


def _plan_drivers(step: DriversStep) -> DriversPlan:
    (file,) = _driver_files(step.recipe, step.spec, step.topology)
    return DriversPlan(step.spec.host, (), sysctl=SysctlPlan(file, TPU_SYSCTL, step.found.get("sysctl") or {}))


def _driver_line(recipe: Recipe, spec: HostPlan) -> str:
    settings = ", ".join(f"{k} = {v}" for k, v in sorted(TPU_SYSCTL.items()))
    return f"{spec.accelerator_model}: host settings {settings} ({TPU_SYSCTL_FILE})"


KIND = AcceleratorKind(
    name=NAME,
    probe_sections=(NAME,),
    recipe_rule=_recipe_rule,
    devices_per_accelerator=_devices,
    read_profile=_profile,
    matches_model=matches_model,
    drivers_request=_drivers_request,
    plan_drivers=_plan_drivers,
    driver_files=_driver_files,
    driver_line=_driver_line,
)
