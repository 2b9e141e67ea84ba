"""One host's converge of the example recipe and inventory as ``deploys/kimi.py`` plans it
(``kimi_deploy.converge.plan_converge``), without pyinfra."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from kimi_deploy import converge
from kimi_deploy.converge import Converge, plan_converge
from kimi_deploy.deploy_plan import DeployPlan
from kimi_deploy.inventory import Inventory
from kimi_deploy.planner import plan
from kimi_deploy.recipe import Recipe
from tests.conftest import RECIPE


def host_converge(recipe: Recipe, prod: Inventory, name: str) -> Converge:
    """Host ``name``'s converge (the topology's key read as the recipe says: set it first)."""
    full = plan(recipe, RECIPE, prod)
    spec = full.for_host(name)
    # the tests' environment stands for the controller's (secrets named by variable, the Hub token)
    return plan_converge(DeployPlan(recipe, RECIPE, spec, prod.host(name), full.topology(spec.topology)), os.environ)


def lock_stands_in(monkeypatch: pytest.MonkeyPatch, compact: dict[str, list[Any]]) -> None:
    """The example recipe's revision has no lock file: ``compact`` (file -> [size, digest]) is its lock."""
    monkeypatch.setattr(converge, "read_lock", lambda recipe: SimpleNamespace(compact=lambda: compact))
