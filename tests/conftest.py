"""Shared fixtures: tests run from the repository root, as pyinfra and the CLI do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.inventory import Inventory
from kimi_deploy.inventory_file import load_inventory
from kimi_deploy.recipe import Recipe, load_recipe

ROOT = Path(__file__).resolve().parent.parent
# The tests' local cluster is one of their own, never the user's demo cluster (/var/lib/kimi-cluster,
# 10.213.7.0/24): its state directory and subnet, for every `kimi-deploy cluster` and pyinfra run
# the tests start (inventories/demo.py reads KIMI_CLUSTER_DIR). The session that starts it takes
# it down (tests/e2e/conftest.py, tests/localcluster/conftest.py).
os.environ.setdefault("KIMI_CLUSTER_DIR", "/var/lib/kimi-cluster-e2e")
os.environ.setdefault("KIMI_CLUSTER_SUBNET", "10.213.17.0/24")
RECIPE = "recipes/kimi-k3.1-pro.yaml"
PROD = "inventories/prod.py"


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
