"""deploys/kimi.py plans exactly what ``kimi-deploy plan`` shows, and stops on bad input.

pyinfra runs here only against ``@local`` (this machine, no network); the example production
inventory is loaded but never connected to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pyinfra.api.state import State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory_from_files

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_pyinfra.host_plan import plan_for
from tests.conftest import PROD, RECIPE, ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def test_deploy_plan_equals_cli_plan_for_every_host(recipe: Recipe, prod: Inventory) -> None:
    with ctx_state.use(State()):
        inventory = make_inventory_from_files(PROD, cwd=str(ROOT))
    expected = plan(recipe, RECIPE, prod)
    hosts = list(inventory)
    assert len(hosts) == len(expected.hosts)
    with ctx_state.use(State()):  # a run's context lives on its State
        for host in hosts:
            if host.name.startswith("tpu7x-"):
                # refused as validate refuses it: no TPU engine release registers the model
                with pytest.raises(ConfigError, match=r"topologies\.tpu7x: sglang-jax 0\.1\.0rc0 does not register"):
                    plan_for(inventory, host, PROD)
                continue
            deploy = plan_for(inventory, host, PROD)
            assert deploy.spec == expected.for_host(host.name)
            assert deploy.host == prod.host(host.name)


def _run_deploy(tmp_path: Path, recipe_file: Path) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "local.py"
    inventory.write_text(f'b300 = [("@local", {{"kimi_recipe": {str(recipe_file)!r}}})]\n', encoding="utf-8")
    return subprocess.run(
        [PYINFRA, str(inventory), "deploys/kimi.py", "-y"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _one_error(run: subprocess.CompletedProcess[str]) -> str:
    """The run failed, and pyinfra names one error: that line."""
    assert run.returncode != 0
    errors = [line for line in (run.stdout + run.stderr).splitlines() if "pyinfra error" in line]
    assert len(errors) == 1
    return errors[0]


def test_deploy_refuses_a_revision_without_lock_before_any_change(tmp_path: Path) -> None:
    run = _run_deploy(tmp_path, ROOT / RECIPE)
    error = _one_error(run)
    assert error.endswith(
        "recipes/locks/moonshotai--Kimi-K3.1-Pro@5e2b7a09c41d8f36b0e9a4c7d21f58e3a6b90c1d.json: no lock for "
        "moonshotai/Kimi-K3.1-Pro@5e2b7a09c41d8f36b0e9a4c7d21f58e3a6b90c1d: run `kimi-deploy lock RECIPE`"
    )
    assert "Connected" in run.stdout + run.stderr
    assert "Starting operation" not in run.stdout + run.stderr


def test_deploy_stops_with_one_line_on_a_bad_recipe(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    data["model"]["license"]["accepted"] = False
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    run = _run_deploy(tmp_path, bad)
    error = _one_error(run)
    assert error.endswith(
        f"{bad}: model.license: license 'kimi-k3.1-license' is not acknowledged: read it and set accepted: true"
    )


def test_deploy_refuses_a_release_pin_its_committed_locks_do_not_hold_before_any_change(tmp_path: Path) -> None:
    """A new engine pin in a recipe that names its hosts' OS, not yet locked: the run stops on it,
    in one line, before any host is changed (and before the weights' lock is looked at)."""
    data = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    data["engines"]["vllm"]["version"] = "0.34.1"
    unlocked = tmp_path / "unlocked.yaml"
    unlocked.write_text(yaml.safe_dump(data), encoding="utf-8")
    run = _run_deploy(tmp_path, unlocked)
    error = _one_error(run)
    assert "recipes/locks/releases/vllm-0.34.1+fastsafetensors-0.5.0+" in error
    assert error.endswith(
        "no lock of vllm-0.34.1+fastsafetensors-0.5.0+mooncake-transfer-engine-cuda13-0.3.13.post1+nixl-1.5.1 for "
        "Python 3.12, x86_64, glibc 2.39 (topologies single-node): run `kimi-deploy lock RECIPE --releases` and "
        "commit what it writes"
    )
    assert "Starting operation" not in run.stdout + run.stderr
