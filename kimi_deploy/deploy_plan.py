"""The plan as a deploy sees it: the recipe named by host data, the whole inventory, this host."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_deploy.inventory import Inventory, InventoryHost
from kimi_deploy.inventory_file import from_pyinfra
from kimi_deploy.planner import plan
from kimi_deploy.recipe import Recipe, load_recipe
from kimi_deploy.servespec import HostPlan, Plan

DEFAULT_RECIPE = "recipes/kimi-k3.1-pro.yaml"


def inventory_label(argv: list[str] | None = None) -> str:
    """The inventory file pyinfra was given (its first argument), for error messages."""
    args = sys.argv if argv is None else argv
    if len(args) > 1 and Path(args[1]).is_file():
        return args[1]
    return "inventory"


@dataclass(frozen=True)
class DeployPlan:
    """One host's part of the plan, with the recipe and inventory data it came from."""

    recipe: Recipe
    recipe_file: str
    spec: HostPlan
    host: InventoryHost
    # every host of this host's topology, this one included, in plan order
    topology: tuple[HostPlan, ...] = ()


def plan_for(inventory: Any, host: Any, label: str | None = None) -> DeployPlan:
    """Plan the whole inventory exactly as ``kimi-deploy plan`` does and return ``host``'s part.

    ``inventory`` and ``host`` are pyinfra's objects; the recipe is the host's ``kimi_recipe``
    data (relative to the directory pyinfra runs in) or the default recipe.
    """
    recipe_file = host.data.get("kimi_recipe") or DEFAULT_RECIPE
    recipe, ours, full = _whole_plan(inventory, recipe_file, label or inventory_label())
    spec = full.for_host(host.name)
    return DeployPlan(recipe, recipe_file, spec, ours.host(host.name), full.topology(spec.topology))


# pyinfra runs a deploy file once per host: the whole inventory is planned once per run and
# recipe, not once per host (which grows with the square of the hosts). Holding the inventory
# object keeps its id from being reused by another.
_last: tuple[tuple[int, str, str], Any, tuple[Recipe, Inventory, Plan]] | None = None


def _whole_plan(inventory: Any, recipe_file: str, label: str) -> tuple[Recipe, Inventory, Plan]:
    global _last  # noqa: PLW0603 - a one-entry cache for the current run
    key = (id(inventory), recipe_file, label)
    if _last is not None and _last[0] == key and _last[1] is inventory:
        return _last[2]
    recipe = load_recipe(recipe_file)
    ours = from_pyinfra(inventory, label)
    result = (recipe, ours, plan(recipe, recipe_file, ours))
    _last = (key, inventory, result)
    return result
