"""``kimi-deploy converge``: the deploy run by the pyinfra installed beside kimi-deploy, its
options passed on, and one line for what is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.converge_command import deploy_names, pyinfra_argv
from kimi_pyinfra.starter import init
from tests.conftest import ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def test_the_converge_is_the_kimi_deploy_with_yes_and_pyinfras_options_passed_on() -> None:
    assert pyinfra_argv(["inventories/prod.py"], ROOT) == ["inventories/prod.py", "deploys/kimi.py", "-y"]
    # a dry run without -y: pyinfra works out what would change only where it may prompt
    assert pyinfra_argv(["inventories/prod.py", "--dry", "--diff", "--limit", "b300-01"], ROOT) == [
        "inventories/prod.py",
        "deploys/kimi.py",
        "--dry",
        "--diff",
        "--limit",
        "b300-01",
    ]
    assert pyinfra_argv(["inventories/prod.py", "--deploy", "rollback", "--yes"], ROOT) == [
        "inventories/prod.py",
        "deploys/rollback.py",
        "--yes",
    ]
    assert pyinfra_argv(["inventories/prod.py", "--deploy=report"], ROOT)[1] == "deploys/report.py"
    assert "kimi" in deploy_names()


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ([], "INVENTORY: give the inventory first"),
        (["--dry"], "INVENTORY: give the inventory first"),
        (["inventories/nope.py"], "inventories/nope.py: no such inventory file"),
        (["inventories/prod.py", "--deploy", "nope"], "--deploy: expected one of bench, commcheck"),
        (["inventories/prod.py", "--deploy"], "--deploy: expected a deploy's name"),
    ],
)
def test_what_cannot_run_is_one_line(words: list[str], said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        pyinfra_argv(words, ROOT)


def test_a_folder_without_the_deploy_file_is_told_where_to_run_from(tmp_path: Path) -> None:
    (tmp_path / "inventory.py").write_text("hosts = []\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no such deploy file: run from a folder kimi-deploy init wrote"):
        pyinfra_argv(["inventory.py"], tmp_path)


def test_it_runs_the_pyinfra_of_its_own_installation_in_a_folder_init_wrote(tmp_path: Path) -> None:
    site = tmp_path / "site"
    init(site)
    # pyinfra's own --help, from the interpreter kimi-deploy runs in: the converge reached pyinfra
    run = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "converge", "inventories/prod.py", "--help"],
        cwd=site,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("Usage: pyinfra [OPTIONS] INVENTORY OPERATIONS...")
    refused = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "converge", "inventories/nope.py"],
        cwd=site,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert (refused.returncode, refused.stderr) == (
        2,
        "kimi-deploy converge: inventories/nope.py: no such inventory file\n",
    )
