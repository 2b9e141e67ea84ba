"""Preflight gates: a host's hardware (its HostProfile) against what the plan needs of it.

Pure. Each gate returns ``None`` or one line naming the host, the gate, what the plan expects and
what the host has, e.g. ``gpu-07: accelerators: pool decode needs 8 x GB300 with >= 260 GiB,
found 4 x NVIDIA H100 80GB HBM3 (79 GiB)``. A deploy runs them before it changes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from kimi_deploy.accelerators import accelerator
from kimi_deploy.accelerators.interface import GIB, size_text
from kimi_deploy.host.profile import port_active
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.catalog import engine_catalog

# Free space kept beyond the weights themselves: logs, caches, a partial download's overlap.
DISK_MARGIN_PERCENT = 5
# Share of host RAM the HiCache host pool may take; the rest runs the OS and the engine.
HICACHE_RAM_PERCENT = 90


@dataclass(frozen=True)
class Needs:
    """What the host must offer, from the recipe, the plan and the lock."""

    recipe: Recipe
    spec: HostPlan
    weights_bytes: int
    missing_bytes: int
    rdma_devices: list[str]


def accelerators(needs: Needs, profile: HostProfile) -> str | None:
    """The accelerators the plan gives an engine host, as its kind reads the profile."""
    spec = needs.spec
    if spec.role == "router":
        return None
    return accelerator(spec.accelerator_vendor).check_host(spec, profile)


def disk(needs: Needs, profile: HostProfile) -> str | None:
    """Room for what is missing of this revision now, and for a second copy (the rollback) ever."""
    spec = needs.spec
    if spec.role == "router":
        return None
    d = profile["disk"]
    free, total = d["free_bytes"] or 0, d["total_bytes"] or 0
    where = f"{d['path']} ({d['fs_type']})"
    need_now = needs.missing_bytes * (100 + DISK_MARGIN_PERCENT) // 100
    if needs.missing_bytes and free < need_now:
        return f"disk: {where} needs {size_text(need_now)} free for the weights, found {size_text(free)} free"
    need_ever = 2 * needs.weights_bytes * (100 + DISK_MARGIN_PERCENT) // 100
    if total < need_ever:
        return (
            f"disk: {where} needs {size_text(need_ever)} in all (weights and a rollback copy), found {size_text(total)}"
        )
    return None


def host_ram(needs: Needs, profile: HostProfile) -> str | None:
    topo = needs.recipe.topologies[needs.spec.topology]
    if topo.hicache is None or needs.spec.role == "router":
        return None
    hbm = needs.spec.accelerators * needs.spec.accelerator_memory_gib * GIB
    need = int(topo.hicache.ratio * hbm)
    total = profile["memory"]["total_bytes"] or 0
    if need > total * HICACHE_RAM_PERCENT // 100:
        return (
            f"host RAM: HiCache ratio {topo.hicache.ratio:g} needs {size_text(need)} "
            f"({HICACHE_RAM_PERCENT}% of RAM at most), found {size_text(total)}"
        )
    return None


def rdma_asked(needs: Needs) -> bool:
    """Whether the host moves its topology's KV cache over RDMA (the RDMA gate asks something of it)."""
    topo = needs.recipe.topologies[needs.spec.topology]
    return topo.kv_transfer is not None and topo.kv_transfer.transport == "rdma" and needs.spec.role != "router"


def rdma(needs: Needs, profile: HostProfile) -> str | None:
    if not rdma_asked(needs):
        return None
    ports = profile["rdma"]
    for device in needs.rdma_devices:
        name = device.split(":", 1)[0]
        states = [p["state"] or "state unknown" for p in ports if p["device"] == name]
        if not any(port_active(p) for p in ports if p["device"] == name):
            found = ", ".join(states) if states else "no such device"
            return f"RDMA: {name} needs an ACTIVE port for KV transfer, found {found}"
    return None


def python(needs: Needs, profile: HostProfile) -> str | None:
    """The host's python3, which every release is installed with, against the Pythons the
    engine's release installs on (its wheel's Requires-Python, in its catalog): a host it cannot
    install on is named before anything changes, not by the resolver's error at install."""
    spec = needs.spec
    if spec.role == "router":
        return None
    engine = needs.recipe.topologies[spec.topology].engine
    catalog = engine_catalog(needs.recipe, engine)
    found = profile["os"]["python"]
    if catalog.requires_python is None or not found:
        return None
    try:
        fits = Version(found) in SpecifierSet(catalog.requires_python)
    except (InvalidSpecifier, InvalidVersion):
        return None
    if fits:
        return None
    release = needs.recipe.engines[engine]
    return (
        f"python3: {release.distribution(engine)} {release.version} installs on Python "
        f"{catalog.requires_python}, found {found}"
    )


GATES: tuple[Callable[[Needs, HostProfile], str | None], ...] = (
    accelerators,
    python,
    disk,
    host_ram,
    rdma,
)


def check(needs: Needs, profile: HostProfile) -> list[str]:
    """Every failed gate, as ``HOST: gate: expected, found`` lines (empty: the host may proceed);
    what the host reported in them is shown with its control characters escaped (``printable``)."""
    return [printable(f"{needs.spec.host}: {line}") for gate in GATES if (line := gate(needs, profile)) is not None]
