"""Each deploy is a pyinfra ``@deploy`` function of the package (``kimi_pyinfra.deploys``), and
``deploys/<name>.py`` is the two-line file that calls it: the same file in a checkout and in the
folder ``kimi-deploy init`` writes, so a user's copy runs what the checkout runs."""

from __future__ import annotations

import ast
import importlib

import pytest

from kimi_pyinfra.starter import DEPLOYS, starter_files
from tests.conftest import ROOT

NAMES = sorted(p.stem for p in DEPLOYS.glob("*.py") if not p.name.startswith("_"))


def test_every_deploy_of_the_package_has_its_caller_and_no_caller_is_left_without_one() -> None:
    assert sorted(p.stem for p in (ROOT / "deploys").glob("*.py")) == NAMES
    assert "kimi" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_checkouts_deploy_file_is_the_one_init_writes(name: str) -> None:
    assert (ROOT / "deploys" / f"{name}.py").read_text(encoding="utf-8") == starter_files()[f"deploys/{name}.py"]


@pytest.mark.parametrize("name", NAMES)
def test_a_deploy_file_only_calls_the_packages_deploy_function(name: str) -> None:
    tree = ast.parse((ROOT / "deploys" / f"{name}.py").read_text(encoding="utf-8"))
    code = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    assert [type(n) for n in code] == [ast.ImportFrom, ast.Expr]
    imported, called = code
    assert isinstance(imported, ast.ImportFrom)
    assert imported.module == f"kimi_pyinfra.deploys.{name}"
    assert isinstance(called, ast.Expr)
    assert isinstance(called.value, ast.Call)
    function = getattr(importlib.import_module(f"kimi_pyinfra.deploys.{name}"), f"deploy_{name}")
    # pyinfra's @deploy: its operations run named "<name> | <operation>"
    assert function._inner.deploy_name == name
