"""The fidelity ledger: everything the shipped recipe's plan emits, per topology, has a source, and
the ledger kept in docs/ is the one the plan makes today.

Regenerate after an intended change with
``kimi-deploy ledger recipes/kimi-k3.1-pro.yaml inventories/prod.py > docs/fidelity-ledger.md``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.emitted import Emission, emissions
from kimi_deploy.render.fidelity_ledger import gaps, read_citations, render
from tests.conftest import PROD, RECIPE, ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

LEDGER = ROOT / "docs" / "fidelity-ledger.md"
TOPOLOGIES = {"single-node", "gb300-pd", "tpu7x", "tokenspeed-single", "tokenspeed-multi"}


def _emitted(recipe: Recipe, prod: Inventory) -> list[Emission]:
    return emissions(recipe, plan(recipe, RECIPE, prod))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", *args], capture_output=True, text=True, cwd=ROOT, check=False
    )


def test_every_emission_of_every_topology_is_cited(recipe: Recipe, prod: Inventory) -> None:
    emitted = _emitted(recipe, prod)
    assert {e.topology for e in emitted} == TOPOLOGIES
    # each kind is there: flags, variables, config keys (mooncake.json, nginx), unit directives
    assert {e.kind for e in emitted} == {"flag", "env", "config", "unit"}
    found = gaps(emitted, read_citations({e.program for e in emitted}))
    assert found.lines() == []


def test_the_kept_ledger_is_the_plans(recipe: Recipe, prod: Inventory) -> None:
    emitted = _emitted(recipe, prod)
    made = render(RECIPE, PROD, emitted, read_citations({e.program for e in emitted}))
    assert LEDGER.read_text(encoding="utf-8") == made, "regenerate docs/fidelity-ledger.md (see this file's docstring)"
    assert "**uncited**" not in made


def test_cli_checks_the_kept_ledger() -> None:
    done = _cli("ledger", RECIPE, PROD, "--check", str(LEDGER.relative_to(ROOT)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: docs/fidelity-ledger.md is the ledger of recipes/kimi-k3.1-pro.yaml")


def test_an_emission_without_a_source_fails_by_name(tmp_path: Path) -> None:
    """A variable the recipe adds, which no citation vouches for: the ledger names it and fails."""
    tree = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    tree["topologies"]["single-node"]["env"]["VLLM_SOMETHING_NEW"] = "1"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    done = _cli("ledger", str(path), PROD, "--topology", "single-node")
    assert done.returncode == 1
    assert (
        "kimi-deploy: single-node: kimi-vllm: env VLLM_SOMETHING_NEW (vllm-0.33.0): "
        "no citation in citations/vllm-0.33.0.yaml env"
    ) in done.stderr.splitlines()
    assert "| kimi-vllm | vllm-0.33.0 | env | `VLLM_SOMETHING_NEW` | `1` | **uncited** |" in done.stdout


def test_a_kept_ledger_that_drifted_fails(tmp_path: Path) -> None:
    kept = tmp_path / "ledger.md"
    kept.write_text(LEDGER.read_text(encoding="utf-8").replace("`--tensor-parallel-size`", "`--tp`", 1))
    done = _cli("ledger", RECIPE, PROD, "--check", str(kept))
    assert done.returncode == 1
    assert f"{kept}: differs from the ledger of the plan" in done.stderr


def test_a_citation_must_name_a_source(tmp_path: Path) -> None:
    folder = tmp_path / "citations"
    folder.mkdir()
    (folder / "vllm-0.34.0.yaml").write_text('flag:\n  --port: "the usual one"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        read_citations(["vllm-0.34.0"], folder)
    assert str(err.value) == (
        "citations/vllm-0.34.0.yaml: flag.--port: a citation names a release's file:line or a URL, "
        "found 'the usual one'"
    )


def test_a_citation_nothing_emits_is_reported(recipe: Recipe, prod: Inventory) -> None:
    emitted = [e for e in _emitted(recipe, prod) if e.topology == "single-node"]
    citations = {"vllm-0.34.0": {"flag": {"--headless": "vllm/entrypoints/common/cli_args.py:446"}}}
    assert (
        "citations/vllm-0.34.0.yaml: flag: --headless: cited, but no topology emits it"
        in gaps(emitted, citations).lines()
    )


def test_what_is_read_of_the_files(recipe: Recipe, prod: Inventory) -> None:
    """Flags with their values (``--a=b`` as mooncake_master takes them), the keys of mooncake.json,
    nginx's directives but not the entries of its map blocks, each unit directive once although
    ExecStart runs over several lines, and the secret environment without its value."""
    emitted = [e for e in _emitted(recipe, prod) if e.topology == "gb300-pd"]
    by = {(e.unit, e.kind, e.name): e for e in emitted}
    assert by[("kimi-mooncake-master", "flag", "--rpc_port")].value == "50051"
    assert by[("kimi-vllm", "flag", "--tensor-parallel-size")].value == "8"
    assert by[("kimi-vllm", "flag", "--headless")].value == ""
    assert by[("kimi-vllm", "config", "mooncake.json: mode")].value == "embedded"
    assert by[("kimi-vllm", "env", "VLLM_API_KEY")].value == "placeholder-secret"
    assert ("kimi-gateway", "config", "nginx.conf: js_import") in by
    assert ("kimi-gateway", "config", "nginx.conf: default") not in by  # a map entry, from the keys file
    assert not any(e.kind == "config" and e.name.startswith("nginx.conf: ~") for e in emitted)
    assert sum(1 for e in emitted if e.unit == "kimi-router" and e.name == "[Service] ExecStart") == 1
    assert by[("kimi-router", "flag", "--prefill")].program == "vllm-router-0.1.17"
    assert by[("kimi-gateway", "unit", "[Service] LoadCredential")].program == "systemd"


def test_a_tpu_engine_gets_no_gloo_interface(recipe: Recipe, prod: Inventory) -> None:
    """Gloo is torch's; sglang-jax runs on JAX: nothing reads the variable there."""
    tpu = {e.name for e in _emitted(recipe, prod) if e.topology == "tpu7x" and e.kind == "env"}
    assert "GLOO_SOCKET_IFNAME" not in tpu
    assert {"JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR"} <= tpu
