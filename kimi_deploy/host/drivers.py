"""The drivers step of a host, decided on the controller before any change: each engine host's
accelerator kind plans it (``AcceleratorKind.plan_drivers``); a router host has none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kimi_deploy.accelerators import accelerator
from kimi_deploy.accelerators.interface import DriversPlan, DriversStep
from kimi_deploy.hostside.requests import DriversRequest
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.files import RenderedFile


def probe_request(recipe: Recipe, spec: HostPlan) -> DriversRequest:
    """What ``hostside/driver_probe.py`` reads for this host (a router host has no accelerator)."""
    if spec.role == "router":
        return {}
    return accelerator(spec.accelerator_vendor).drivers_request(recipe, spec)


def plan_drivers(
    recipe: Recipe,
    spec: HostPlan,
    topology: tuple[HostPlan, ...],
    found: Mapping[str, Any],
    *,
    repo_url: str | None = None,
    reboot_allowed: bool = False,
) -> DriversPlan:
    """The drivers step of one host (``found``: its probe answer for ``probe_request``)."""
    # The router of a prefill/decode topology runs on a CPU host: no driver, no accelerator setting.
    if spec.role == "router":
        return DriversPlan(spec.host, ())
    step = DriversStep(recipe, spec, topology, found, repo_url, reboot_allowed)
    return accelerator(spec.accelerator_vendor).plan_drivers(step)


def driver_files(recipe: Recipe, spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[RenderedFile, ...]:
    """Every file the drivers step writes on this host (``topology``: the plans of its topology),
    whatever its probe finds; none on a router host."""
    if spec.role == "router":
        return ()
    return accelerator(spec.accelerator_vendor).driver_files(recipe, spec, topology)


def host_kind_lines(recipe: Recipe, hosts: tuple[HostPlan, ...]) -> list[str]:
    """What the drivers step installs on each kind of host of a topology, one line a kind, as
    ``kimi-deploy plan`` shows it."""
    kinds: dict[str, list[str]] = {}
    for spec in hosts:
        if spec.role == "router":
            continue
        what = accelerator(spec.accelerator_vendor).driver_line(recipe, spec)
        if what is not None:
            kinds.setdefault(what, []).append(spec.host)
    lines = []
    for what, names in kinds.items():
        shown = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}, {len(names)} hosts"
        lines.append(f"drivers ({shown}): {what}")
    return lines
