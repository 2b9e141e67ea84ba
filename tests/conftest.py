"""Shared fixtures: tests run from the repository root, as pyinfra and the CLI do."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe, load_recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.cluster_env import use_tests_cluster

ROOT = Path(__file__).resolve().parent.parent
use_tests_cluster()
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
