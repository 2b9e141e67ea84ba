"""Which rungs of the context ladder a converge climbs (kimi_deploy/serving/context_ladder.py), decided
from the recipe and the host's probe, and what the host is asked to write at each rung: the
demo's real-vLLM topology (one host an instance, on CPUs)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.converge.plan import Converge, plan_converge
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import ContextProbe, Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.serving.context_ladder import (
    climb_for,
    climb_request,
    hardware_label,
    proof_key,
    proven,
    recipe_at,
    rungs_to_climb,
)
from kimi_pyinfra.inventory_file import load_inventory
from tests.host_converge import probe_answer
from tests.profiles import profile_of
from tests.test_cpu_topology import DEMO, INVENTORY

LADDER = [32768, 131072, 262144, 1048576]
CPU_HOST = profile_of(cpu={"model": "Xeon", "count": 2}, memory={"total_bytes": 24 << 30})


def test_a_raise_climbs_each_rung_above_the_one_serving_up_to_the_new_length() -> None:
    assert rungs_to_climb(LADDER, 262144, 32768, set()) == (131072, 262144)
    # Nothing known serving (a new host): from the bottom.
    assert rungs_to_climb(LADDER, 131072, None, set()) == (32768, 131072)
    # A rung proven for the same release, hardware and topology is not climbed again...
    assert rungs_to_climb(LADDER, 1048576, 32768, {131072}) == (262144, 1048576)
    # ...the new length is the last step whenever anything is climbed...
    assert rungs_to_climb(LADDER, 262144, 32768, {262144}) == (131072, 262144)
    # ...and when every rung is proven, nothing is.
    assert rungs_to_climb(LADDER, 262144, 32768, {131072, 262144}) == ()


def test_lowering_or_keeping_the_length_climbs_nothing() -> None:
    assert rungs_to_climb(LADDER, 131072, 262144, set()) == ()
    assert rungs_to_climb(LADDER, 131072, 131072, set()) == ()


def test_a_proof_counts_for_its_key_and_unit_only_and_a_malformed_entry_proves_nothing() -> None:
    good = {"key": "k1", "unit": "kimi-vllm", "rung": 131072, "passed": True}
    proofs: list[Any] = [
        good,
        {**good, "rung": 262144, "passed": False},
        {**good, "rung": 32768, "key": "k2"},
        {**good, "rung": 65536, "unit": "kimi-sglang"},
        {**good, "rung": "1048576"},
        {**good, "rung": True},
        {**good, "passed": "yes", "rung": 4096},
    ]
    assert proven(proofs, "k1", "kimi-vllm") == {131072}


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Recipe, str]:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(INVENTORY, encoding="utf-8")
    key = tmp_path / "api-key"
    key.write_text("test-key-1\n", encoding="utf-8")
    recipe = load_recipe(DEMO)
    topo = recipe.topologies["demo-vllm"]
    assert topo.expose is not None
    expose = topo.expose.model_copy(update={"api_key": topo.expose.api_key.model_copy(update={"file": str(key)})})
    topologies = {**recipe.topologies, "demo-vllm": topo.model_copy(update={"expose": expose})}
    recipe = recipe.model_copy(update={"context_probe": ContextProbe(), "topologies": topologies})
    return recipe, str(inventory)


def _deploy(recipe: Recipe, inventory: str, host: str = "kimi-h1") -> tuple[DeployPlan, Converge]:
    ours = load_inventory(inventory)
    full = plan(recipe, DEMO, ours)
    spec = full.for_host(host)
    deploy = DeployPlan(recipe, DEMO, spec, ours.host(host), full.topology(spec.topology))
    return deploy, plan_converge(deploy, os.environ)


def _serving(todo: Converge, at: Converge, context: int | None) -> HostState:
    """The probe of a host running ``at``'s engine (started by the ladder at ``context``)."""
    found = probe_answer(at)
    found["units"] = {n: {**u, "context": context} for n, u in found["units"].items()}
    found["hardware"] = CPU_HOST
    return found


def test_a_converge_raising_the_length_climbs_and_is_asked_to_write_the_unit_alone(demo: tuple[Recipe, str]) -> None:
    recipe, inventory = demo
    low, high = recipe_at(recipe, "demo-vllm", 32768), recipe_at(recipe, "demo-vllm", 262144)
    deploy, todo = _deploy(high, inventory)
    _, before = _deploy(low, inventory)
    climb = climb_for(deploy, todo, _serving(todo, before, 32768))
    assert climb is not None
    assert (climb.unit, climb.rungs, climb.back) == ("kimi-vllm", (131072, 262144), 32768)
    assert climb.hardware == "cpu: 2 x Xeon, 24 GiB"
    at = {n: _deploy(recipe_at(recipe, "demo-vllm", n), inventory)[1] for n in climb.lengths()}
    request = climb_request(climb, deploy, todo, at, "run-7")
    # Each rung writes the engine's unit alone, with its own --max-model-len.
    for rung, length in zip(request["rungs"], (131072, 262144), strict=True):
        (unit,) = rung["files"]
        assert unit["path"] == "/etc/systemd/system/kimi-vllm.service"
        assert f" --max-model-len {length} " in unit["content"]
    assert request["back"] is not None
    assert " --max-model-len 32768 " in request["back"]["files"][0]["content"]
    # The new length's rung is the converge's own unit: what ``Rendered units`` put in place.
    target = next(f for f in todo.files if f.path == "/etc/systemd/system/kimi-vllm.service")
    assert request["rungs"][-1]["files"][0]["content"] == target.content
    assert request["rungs"][-1]["release"] == next(u.release for u in todo.units if u.name == "kimi-vllm")
    assert request["proof"]["key"] == climb.key
    # the engine itself, on loopback behind its gateway
    assert request["smoke"]["url"] == "http://127.0.0.1:8010"
    # No secret travels in the request (it is in the host program's argv).
    assert "secrets" not in str([f["path"] for r in request["rungs"] for f in r["files"]])


def test_no_climb_without_a_probe_for_a_running_engine_or_once_every_rung_is_proven(demo: tuple[Recipe, str]) -> None:
    recipe, inventory = demo
    deploy, todo = _deploy(recipe_at(recipe, "demo-vllm", 262144), inventory)
    _, before = _deploy(recipe_at(recipe, "demo-vllm", 32768), inventory)
    found = _serving(todo, before, 32768)
    bare = recipe_at(recipe, "demo-vllm", 262144).model_copy(update={"context_probe": None})
    assert climb_for(_deploy(bare, inventory)[0], _deploy(bare, inventory)[1], found) is None
    # The engine already runs this converge's release: nothing restarts, nothing climbs.
    assert climb_for(deploy, todo, _serving(todo, todo, 262144)) is None
    key = proof_key(deploy, hardware_label(CPU_HOST))
    found["ladder"] = [{"key": key, "unit": "kimi-vllm", "rung": r, "passed": True} for r in (131072, 262144)]
    assert climb_for(deploy, todo, found) is None
    # The same proofs under other hardware prove nothing.
    found["hardware"] = {**CPU_HOST, "cpu": {"model": "Xeon", "count": 16}}
    assert climb_for(deploy, todo, found) is not None


def test_another_engine_release_is_a_key_of_its_own(demo: tuple[Recipe, str]) -> None:
    recipe, inventory = demo
    deploy, _ = _deploy(recipe, inventory)
    vllm = recipe.engines["vllm"]
    # another release, resolved per host (no OS named: 0.31.0 has no lock beside the recipe)
    engines = {**recipe.engines, "vllm": vllm.model_copy(update={"version": "0.31.0"})}
    other = recipe.model_copy(update={"engines": engines, "os": None})
    longer = recipe_at(recipe, "demo-vllm", 131072)
    label = hardware_label(CPU_HOST)
    assert proof_key(_deploy(other, inventory)[0], label) != proof_key(deploy, label)
    # The length itself is not part of the key: a proof is of the rung, under the key.
    assert proof_key(_deploy(longer, inventory)[0], label) == proof_key(deploy, label)


def test_a_probe_whose_answer_is_not_in_its_needle_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("expect: '42' is not in needle 'The vault code is 4817.'")):
        ContextProbe(expect="42")


def test_a_file_the_length_changes_must_be_roots_plain_file(demo: tuple[Recipe, str]) -> None:
    recipe, inventory = demo
    deploy, todo = _deploy(recipe_at(recipe, "demo-vllm", 131072), inventory)
    _, before = _deploy(recipe_at(recipe, "demo-vllm", 32768), inventory)
    climb = climb_for(deploy, todo, _serving(todo, before, 32768))
    assert climb is not None
    at = {n: _deploy(recipe_at(recipe, "demo-vllm", n), inventory)[1] for n in climb.lengths()}
    unit = next(f for f in todo.files if f.path.endswith("kimi-vllm.service"))
    secret = type(unit)(unit.path, unit.content, unit.mode, "root", secret=True)
    bad = Converge(**{**todo.__dict__, "files": [secret if f is unit else f for f in todo.files]})
    with pytest.raises(
        ConfigError, match=re.escape("kimi-vllm.service changes with the context length and is not a plain file")
    ):
        climb_request(climb, deploy, bad, at, "run-7")
