"""One host's part of the plan, with the recipe and inventory data it came from."""

from __future__ import annotations

from dataclasses import dataclass

from kimi_deploy.inventory import InventoryHost
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.recipe import Recipe

DEFAULT_RECIPE = "recipes/kimi-k3.1-pro.yaml"


@dataclass(frozen=True)
class DeployPlan:
    """One host's part of the plan, with the recipe and inventory data it came from."""

    recipe: Recipe
    recipe_file: str
    spec: HostPlan
    host: InventoryHost
    # every host of this host's topology, this one included, in plan order
    topology: tuple[HostPlan, ...] = ()


def part_of(recipe: Recipe, recipe_file: str, host: InventoryHost, whole: Plan) -> DeployPlan:
    """``host``'s part of ``whole``, the plan of the inventory it belongs to."""
    spec = whole.for_host(host.name)
    return DeployPlan(recipe, recipe_file, spec, host, whole.topology(spec.topology))
