"""Each deploy is a pyinfra ``@deploy`` function of the package (``kimi_pyinfra.deploys``), and
``deploys/<name>.py`` is the small file that calls it: the same file in a checkout and in the
folder ``kimi-deploy init`` writes, so a user's copy runs what the checkout runs. Run by a pyinfra
of another installation, which cannot import kimi-deploy, it says so in one line."""

from __future__ import annotations

import ast
import importlib
import runpy
import sys

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
    assert [type(n) for n in code] == [ast.Try, ast.Expr]
    guarded, called = code
    assert isinstance(guarded, ast.Try)
    imported = guarded.body[0]
    assert len(guarded.body) == 1
    assert isinstance(imported, ast.ImportFrom)
    assert imported.module == f"kimi_pyinfra.deploys.{name}"
    assert [a.name for a in imported.names] == [f"deploy_{name}"]
    assert isinstance(called, ast.Expr)
    assert isinstance(called.value, ast.Call)
    function = getattr(importlib.import_module(f"kimi_pyinfra.deploys.{name}"), f"deploy_{name}")
    # pyinfra's @deploy: its operations run named "<name> | <operation>"
    assert function._inner.deploy_name == name


@pytest.mark.parametrize("name", ["kimi", "bench"])
def test_a_pyinfra_without_kimi_deploy_is_told_in_one_line_what_to_run(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a pyinfra of another installation finds: no kimi_pyinfra to import
    for loaded in [m for m in sys.modules if m.startswith("kimi_pyinfra.")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, "kimi_pyinfra", None)
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(ROOT / "deploys" / f"{name}.py"))
    said = str(stopped.value.code)
    assert "\n" not in said
    command = "kimi-deploy converge INVENTORY" + ("" if name == "kimi" else f" --deploy {name}")
    assert said.startswith(f"deploys/{name}.py: this pyinfra has no kimi-deploy: run `{command}`")


def test_a_missing_dependency_of_kimi_deploy_itself_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kimi_pyinfra.deploys.kimi", None)
    with pytest.raises(ModuleNotFoundError, match=r"kimi_pyinfra\.deploys\.kimi"):
        runpy.run_path(str(ROOT / "deploys" / "kimi.py"))
