"""The plan as a deploy sees it: the recipe named by host data, the whole inventory, this host."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kimi_deploy.converge.plan import Converge, plan_converge
from kimi_deploy.plan.deploy_plan import DEFAULT_RECIPE, DeployPlan, part_of
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.servability import refusals
from kimi_deploy.render.files import keep_compiled
from kimi_deploy.serving.context_ladder import recipe_at
from kimi_pyinfra.inventory_file import from_pyinfra
from kimi_pyinfra.run_context import run_context


def inventory_label(argv: list[str] | None = None) -> str:
    """The inventory file pyinfra was given (its first argument), for error messages."""
    args = sys.argv if argv is None else argv
    if len(args) > 1 and Path(args[1]).is_file():
        return args[1]
    return "inventory"


def plan_for(inventory: Any, host: Any, label: str | None = None) -> DeployPlan:
    """Plan the whole inventory exactly as ``kimi-deploy plan`` does and return ``host``'s part;
    ``ConfigError`` when its topology's engine release does not register the model (as ``validate``).

    ``inventory`` and ``host`` are pyinfra's objects; the recipe is the host's ``kimi_recipe``
    data (relative to the directory pyinfra runs in) or the default recipe. The whole inventory
    is planned once per run and recipe, not once per host (which grows with the square of the
    hosts).
    """
    recipe_file = host.data.get("kimi_recipe") or DEFAULT_RECIPE
    label = label or inventory_label()
    plans = run_context().plans
    if (recipe_file, label) not in plans:
        recipe = load_recipe(recipe_file)
        ours = from_pyinfra(inventory, label)
        plans[(recipe_file, label)] = (recipe, ours, plan(recipe, recipe_file, ours))
    recipe, ours, whole = plans[(recipe_file, label)]
    part = part_of(recipe, recipe_file, ours.host(host.name), whole)
    # as validate refuses it: a topology whose engine release does not load the model
    topology = part.spec.topology
    refused = run_context().refused
    if (recipe_file, topology) not in refused:
        refused[(recipe_file, topology)] = refusals(recipe, recipe_file, [topology]).get(topology)
    if (why := refused[(recipe_file, topology)]) is not None:
        raise why
    return part


def todo_for(inventory: Any, host: Any) -> tuple[DeployPlan, Converge]:
    """``host``'s plan and converge (pyinfra objects in), once per run for every host: some
    decisions span hosts (the parallel probe needs every host's request, the weights fan-out every
    host's target). ``ConfigError`` as ``plan_for`` raises it."""
    context = run_context()
    if host.name not in context.todos:
        keep_compiled(context.environ)
        deploy = plan_for(inventory, host)
        context.todos[host.name] = (deploy, plan_converge(deploy, context.environ))
    return context.todos[host.name]


def converge_at(inventory: Any, host: Any, length: int) -> Converge:
    """``host``'s converge with its topology's ``max_model_len`` at ``length`` (a rung of the
    context ladder): the inventory planned once per run, recipe and length."""
    deploy, _ = todo_for(inventory, host)
    label = inventory_label()
    context = run_context()
    key = (deploy.recipe_file, f"{label}\0{deploy.spec.topology}\0{length}")
    if key not in context.plans:
        recipe = recipe_at(deploy.recipe, deploy.spec.topology, length)
        ours = from_pyinfra(inventory, label)
        context.plans[key] = (recipe, ours, plan(recipe, deploy.recipe_file, ours))
    recipe, ours, whole = context.plans[key]
    return plan_converge(part_of(recipe, deploy.recipe_file, ours.host(host.name), whole), context.environ)
