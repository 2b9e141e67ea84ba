"""Shared fixtures: tests run from the repository root, as pyinfra and the CLI do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The suite runs as pyinfra runs, from its first test whatever subset is collected: pyinfra's CLI
# package patches the standard library with gevent when imported (kimi_pyinfra.starter imports
# it), and a test module imported before that patch holds the unpatched socket and threading
# while the servers it starts get the patched ones (a thread's join then never sees the answer
# end: tests/test_weights_relay.py run beside tests/test_hub_lock_names.py).
import pyinfra_cli  # noqa: F401  # isort: skip
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Accelerators, Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.cluster_env import use_tests_cluster
from tests.tier import MARK, unit_tier

ROOT = Path(__file__).resolve().parent.parent
use_tests_cluster()
# huggingface_hub reads these once, at its first import, whichever test imports it first: the
# tests' own client downloads take the HTTP path, as the hosts' sync does (hostside/weights_sync.py;
# the fake Hub advertises Xet, as the Hub does, and serves none of it: localcluster/hub.py), and
# send no telemetry.
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
RECIPE = "recipes/kimi-k3.1-pro.yaml"
PROD = "inventories/prod.py"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: starts a process or a listening server (not the unit tier)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(ROOT / "tests" / "e2e") or item.get_closest_marker("localcluster"):
            item.add_marker(MARK)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with unit_tier(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with unit_tier(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with unit_tier(item):
        return (yield)


@pytest.fixture(autouse=True)
def _in_repo_root() -> Iterator[None]:
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)


@pytest.fixture(scope="session")
def recipe() -> Recipe:
    os.chdir(ROOT)
    return load_recipe(RECIPE)


@pytest.fixture(scope="session")
def prod() -> Inventory:
    os.chdir(ROOT)
    return load_inventory(PROD)


def sglang_slice(recipe: Recipe, **update: object) -> Recipe:
    """``recipe`` with its 8-host tpu7x topology served by mainline SGLang on GB300 trays (four
    GPUs a host, as those hosts have four chips), with ``update``: a multi-host SGLang instance
    for the tests of SGLang's own settings (its key in --config, HiCache), which the reference
    recipe serves on GB300 and B300 with vLLM only."""
    topo = recipe.topologies["tpu7x"]
    gpus = Accelerators(vendor="nvidia", model="GB300", per_host=4, memory_gib=topo.accelerators.memory_gib)
    changed = topo.model_copy(update={"engine": "sglang", "accelerators": gpus, **update})
    return recipe.model_copy(update={"topologies": {**recipe.topologies, "tpu7x": changed}})
