"""Who compiles, who serves and who receives each compile cache in a run, and what is refused.

The prefill pool of the example's gb300-pd topology: three instances of two hosts, so the hosts of
rank 0 (gb300-p01, p03, p05) share one key (``tests/test_compile_cache_key.py``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from kimi_deploy.compile_cache.pins import Pins
from kimi_deploy.converge.compile_caches import CompileCacheStep, plan_compile_caches
from kimi_deploy.converge.plan import Converge
from kimi_deploy.hostside.compile_cache_found import manifest_digest
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.operations.compile_cache import checked_manifest
from tests.conftest import RECIPE

RANK0 = ("gb300-p01", "gb300-p03", "gb300-p05")
# A rolling change of the pool, every instance serving: the even instances first (p01's, p05's),
# then the odd one (p03's) once they answer (``kimi_deploy.plan.start_batches``).
ROLLING = {"gb300-p01": 0, "gb300-p03": 1, "gb300-p05": 0}
MANIFEST = {"3f2a/rank_0_0/backbone/model": [10, "sha256:" + "a" * 64]}
OTHER = {"3f2a/rank_0_0/backbone/model": [10, "sha256:" + "b" * 64]}
KEY_FILE = "/etc/kimi/secrets/weights-transfer-key"


def _run(
    recipe: Recipe,
    prod: Inventory,
    found: dict[str, dict[str, Any]],
    pins: Pins,
    starts: tuple[str, ...] = RANK0,
    hosts: tuple[str, ...] = RANK0,
    by_dir: dict[str, dict[str, Any]] | None = None,
    batches: dict[str, int] | None = None,
) -> dict[str, CompileCacheStep]:
    full = plan(recipe, RECIPE, prod)
    each = []
    for name in hosts:
        spec = full.for_host(name)
        deploy = DeployPlan(recipe, RECIPE, spec, prod.host(name), full.topology(spec.topology))
        todo = cast(Converge, SimpleNamespace(user="kimi", checkpoints=[SimpleNamespace(peer_key_file=KEY_FILE)]))
        source = next(u.compile_cache.source for u in spec.units if u.compile_cache is not None)
        probed = {"compile_caches": {source: found[name]} if name in found else dict(by_dir or {})}
        units = {u.name for u in spec.units if u.compile_cache is not None}
        each.append((deploy, todo, probed, frozenset(units if name in starts else set())))
    steps = plan_compile_caches(each, pins, batches)
    return {name: only for name, (only,) in steps.items()}


def _holds(manifest: dict[str, Any], given: dict[str, str] | None = None) -> dict[str, Any]:
    return {"manifest": manifest, "whole": True, "given": given}


def _given(step: CompileCacheStep, manifest: dict[str, Any]) -> dict[str, str]:
    return {"key": step.cache.source.rsplit("/", 1)[-1], "manifest": manifest_digest(manifest)}


def _held(recipe: Recipe, prod: Inventory, pins: Pins) -> dict[str, Any]:
    """The controller holds ``MANIFEST`` for gb300-p01's key: what a host holding that artifact,
    given to its engine, answers of it."""
    first = _run(recipe, prod, {}, pins)["gb300-p01"]
    pins.put(first.cache.source.rsplit("/", 1)[-1], MANIFEST, "gb300-p01")
    return _holds(MANIFEST, _given(first, MANIFEST))


def test_with_no_cache_anywhere_the_first_host_that_starts_compiles_and_packs(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    steps = _run(recipe, prod, {}, Pins(tmp_path))
    assert steps["gb300-p01"].pack is not None
    assert steps["gb300-p01"].pack["source"] == steps["gb300-p01"].cache.target
    assert steps["gb300-p01"].pack["user"] == "kimi"
    assert [steps[h].pack for h in RANK0[1:]] == [None, None]
    assert not any(s.place or s.serves for s in steps.values())
    # a host that does not (re)start this run compiles nothing: the next one that does packs
    later = _run(recipe, prod, {}, Pins(tmp_path), starts=("gb300-p03",))
    assert [h for h in RANK0 if later[h].pack] == ["gb300-p03"]


def test_the_holder_serves_and_the_others_receive_the_manifest_the_controller_holds(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    holder = _held(recipe, prod, pins)
    steps = _run(recipe, prod, {"gb300-p01": holder}, pins)
    p01, p03, p05 = (steps[h] for h in RANK0)
    addresses = [prod.host(h).address for h in RANK0]
    assert p01.serves == (addresses[1], addresses[2])
    assert p01.place is None  # it holds it, and its engine has its copy
    assert p01.pack is None
    for step in (p03, p05):
        assert step.place is not None
        assert step.place["manifest"] == MANIFEST
        assert step.place["peers"] == [{"host": "gb300-p01", "url": f"http://{addresses[0]}:8479"}]
        assert step.place["peer_key_file"] == KEY_FILE
        assert step.place["engine_dir"] == step.cache.target
        assert step.place["user"] == "kimi"
        assert step.moves


def test_a_holder_whose_engine_lacks_its_copy_gets_it_without_the_network(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    name = _run(recipe, prod, {}, pins)["gb300-p01"].cache.source.rsplit("/", 1)[-1]
    pins.put(name, MANIFEST, "gb300-p01")
    steps = _run(recipe, prod, {h: _holds(MANIFEST) for h in RANK0}, pins)
    for h in RANK0:
        place = steps[h].place
        assert place is not None
        assert place["peers"] == []
        assert not steps[h].serves
        assert not steps[h].moves


def test_an_artifact_that_is_not_the_controllers_is_neither_served_nor_given(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    holder = _held(recipe, prod, pins)
    found = {"gb300-p01": holder, "gb300-p03": _holds(OTHER)}
    steps = _run(recipe, prod, found, pins)
    p03 = steps["gb300-p03"]
    assert p03.note is not None
    assert "not the one the controller holds" in p03.note
    assert not p03.serves
    # it receives the held one again, verified file by file, before its engine gets a copy
    assert p03.place is not None
    assert p03.place["manifest"] == MANIFEST
    assert p03.place["peers"][0]["host"] == "gb300-p01"
    assert prod.host("gb300-p03").address in steps["gb300-p01"].serves


def test_a_controller_holding_none_takes_the_first_whole_one_and_holds_it(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    steps = _run(recipe, prod, {"gb300-p03": _holds(MANIFEST), "gb300-p05": _holds(OTHER)}, pins)
    name = steps["gb300-p03"].cache.source.rsplit("/", 1)[-1]
    assert pins.get(name) == MANIFEST
    assert steps["gb300-p05"].note is not None
    assert [p["host"] for p in steps["gb300-p01"].place["peers"]] == ["gb300-p03"]  # type: ignore[index]
    # a half-placed artifact (not whole) is no source
    fresh = Pins(tmp_path / "other")
    half = _run(recipe, prod, {"gb300-p03": {"manifest": MANIFEST, "whole": False, "given": None}}, fresh)
    assert fresh.get(name) is None
    assert half["gb300-p01"].pack is not None


def test_a_cache_of_another_key_is_not_used(recipe: Recipe, prod: Inventory, tmp_path: Path) -> None:
    pins = Pins(tmp_path)
    before = _run(recipe, prod, {}, pins)["gb300-p01"]
    pins.put(before.cache.source.rsplit("/", 1)[-1], MANIFEST, "gb300-p01")
    held = {before.cache.source: _holds(MANIFEST, _given(before, MANIFEST))}
    # the same hosts after the recipe raised the topology's context: another launch, another key
    topology = recipe.topologies["gb300-pd"].model_copy(update={"max_model_len": 262144})
    longer = recipe.model_copy(update={"topologies": {**recipe.topologies, "gb300-pd": topology}})
    steps = _run(longer, prod, {}, pins, by_dir=held)
    assert steps["gb300-p01"].cache.source != before.cache.source
    # what the hosts hold of the old key is neither served nor given: the first host compiles anew
    assert not any(s.place or s.serves for s in steps.values())
    assert steps["gb300-p01"].pack is not None
    assert steps["gb300-p01"].manifest is None


def test_without_a_fan_out_port_nothing_moves_between_hosts(recipe: Recipe, prod: Inventory, tmp_path: Path) -> None:
    alone = recipe.model_copy(update={"weights": recipe.weights.model_copy(update={"fan_out": None})})
    pins = Pins(tmp_path)
    first = _run(alone, prod, {}, pins)["gb300-p01"]
    pins.put(first.cache.source.rsplit("/", 1)[-1], MANIFEST, "gb300-p01")
    steps = _run(alone, prod, {"gb300-p01": _holds(MANIFEST, _given(first, MANIFEST))}, pins)
    assert not any(s.moves for s in steps.values())
    assert steps["gb300-p03"].place is None


def test_the_controller_holds_only_a_manifest_of_plain_names_sizes_and_sha256s() -> None:
    good = {"torch_aot_compile/ab/rank_0_0/model": [10, "sha256:" + "a" * 64]}
    assert checked_manifest({"manifest": good}, "kimi-h1") == good
    for hostile in (
        {"manifest": {"../../etc/cron.d/x": [1, "sha256:" + "a" * 64]}},
        {"manifest": {"m": [-1, "sha256:" + "a" * 64]}},
        {"manifest": {"m": [True, "sha256:" + "a" * 64]}},
        {"manifest": {"m": [1, "sha256:" + "A" * 64]}},
        {"manifest": {"m": [1, "gitblob:" + "a" * 40]}},
        {"manifest": ["m"]},
        "not an answer",
    ):
        with pytest.raises(ValueError, match=r"^kimi-h1"):
            checked_manifest(hostile, "kimi-h1")


def test_in_a_rolling_change_the_first_batch_compiles_and_the_later_one_receives_its_pack(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    steps = _run(recipe, prod, {}, Pins(tmp_path), batches=ROLLING)
    p01, p03, p05 = (steps[h] for h in RANK0)
    assert (p01.batch, p03.batch, p05.batch) == (0, 1, 0)
    # the first host of the first batch compiles and packs once its batch answers; p05, in the
    # same batch, compiles beside it and packs nothing
    assert p01.pack is not None
    assert p05.pack is None
    assert p05.receives is None
    assert not p05.in_batches
    # p03 restarts in the second batch: it receives p01's pack in this run, before it starts
    address = prod.host("gb300-p01").address
    assert p01.serves_packed == (prod.host("gb300-p03").address,)
    assert p03.receives is not None
    assert p03.receives.source == "gb300-p01"
    assert p03.receives.name == p03.cache.source.rsplit("/", 1)[-1]
    request = p03.receives.request
    assert request["peers"] == [{"host": "gb300-p01", "url": f"http://{address}:8479"}]
    assert request["peer_key_file"] == KEY_FILE
    assert (request["dir"], request["engine_dir"], request["user"]) == (p03.cache.source, p03.cache.target, "kimi")
    # nothing was held before the run: nothing is placed before the batches
    assert p03.place is None
    assert p01.moves
    assert p03.moves
    assert not p05.moves
    assert p01.in_batches
    assert p03.in_batches


def test_the_host_that_compiles_is_one_of_the_earliest_batch_that_starts(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    # p01 restarts in the second batch, p03 and p05 in the first: p03 compiles, p01 receives
    late = {"gb300-p01": 1, "gb300-p03": 0, "gb300-p05": 0}
    steps = _run(recipe, prod, {}, Pins(tmp_path), batches=late)
    assert [h for h in RANK0 if steps[h].pack] == ["gb300-p03"]
    receives = steps["gb300-p01"].receives
    assert receives is not None
    assert receives.source == "gb300-p03"
    assert steps["gb300-p03"].serves_packed == (prod.host("gb300-p01").address,)
    # only the hosts that restart take part: p01 keeps its engine this run, and receives nothing
    quiet = _run(recipe, prod, {}, Pins(tmp_path / "quiet"), starts=("gb300-p03", "gb300-p05"), batches=late)
    assert quiet["gb300-p01"].receives is None
    assert not quiet["gb300-p01"].in_batches
    assert quiet["gb300-p03"].serves_packed == ()


def test_a_first_converge_starts_every_host_in_one_batch_and_each_compiles(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    # nothing serves yet: every instance goes in the first batch, and the hosts of a key compile
    # side by side rather than wait for one of them
    steps = _run(recipe, prod, {}, Pins(tmp_path), batches=dict.fromkeys(RANK0, 0))
    assert [h for h in RANK0 if steps[h].pack] == ["gb300-p01"]
    assert not any(s.receives or s.serves_packed for s in steps.values())


def test_a_key_a_host_holds_moves_before_the_batches_not_within_them(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    holder = _held(recipe, prod, pins)
    steps = _run(recipe, prod, {"gb300-p01": holder}, pins, batches=ROLLING)
    assert not any(s.pack or s.receives or s.serves_packed or s.in_batches for s in steps.values())
    place = steps["gb300-p03"].place
    assert place is not None
    assert place["peers"][0]["host"] == "gb300-p01"


def test_a_converged_key_takes_no_step(recipe: Recipe, prod: Inventory, tmp_path: Path) -> None:
    pins = Pins(tmp_path)
    holder = _held(recipe, prod, pins)
    held = dict.fromkeys(RANK0, holder)
    steps = _run(recipe, prod, held, pins, starts=(), batches=ROLLING)
    for step in steps.values():
        assert (step.place, step.pack, step.receives, step.serves, step.serves_packed) == (None, None, None, (), ())
        assert not step.moves
        assert not step.in_batches


def test_without_a_fan_out_port_the_later_batch_compiles_its_own(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    alone = recipe.model_copy(update={"weights": recipe.weights.model_copy(update={"fan_out": None})})
    steps = _run(alone, prod, {}, Pins(tmp_path), batches=ROLLING)
    assert steps["gb300-p01"].pack is not None
    assert steps["gb300-p01"].serves_packed == ()
    assert steps["gb300-p03"].receives is None
    assert not any(s.moves for s in steps.values())


# The example's tpu7x topology: one sglang-jax instance over eight hosts, whose ranks share one key
# (``tests/test_compile_cache_ranks.py``); JAX writes its cache from node rank 0 (tpu7x-w0) alone.
TPU7X = tuple(f"tpu7x-w{i}" for i in range(8))


def _two_tpu7x_instances(tmp_path: Path) -> Recipe:
    """The example with the tpu7x pool as two instances of four hosts (w0-w3, w4-w7)."""
    data = yaml.safe_load(Path(RECIPE).read_text(encoding="utf-8"))
    data["topologies"]["tpu7x"]["pools"]["serve"] |= {"instances": 2, "parallel": {"tp": 16, "ep": 8}}
    changed = tmp_path / "recipe.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_recipe(changed)


def test_a_key_the_ranks_share_is_packed_by_node_rank_0_whatever_the_order(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    # rank 0 is not the first host of the run: the workers' folders stay empty, so it packs anyway
    order = ("tpu7x-w3", "tpu7x-w1", "tpu7x-w0", "tpu7x-w2", "tpu7x-w4", "tpu7x-w5", "tpu7x-w6", "tpu7x-w7")
    steps = _run(recipe, prod, {}, Pins(tmp_path), starts=TPU7X, hosts=order)
    assert [h for h in order if steps[h].pack] == ["tpu7x-w0"]
    assert len({steps[h].cache.source for h in order}) == 1
    # with only workers restarting, no folder fills: nothing is packed
    workers = _run(recipe, prod, {}, Pins(tmp_path / "workers"), starts=TPU7X[1:], hosts=order)
    assert not any(s.pack for s in workers.values())


def test_every_other_host_of_a_shared_key_receives_rank_0s_pack(
    recipe: Recipe, prod: Inventory, tmp_path: Path
) -> None:
    pins = Pins(tmp_path)
    first = _run(recipe, prod, {}, pins, starts=TPU7X, hosts=TPU7X)["tpu7x-w0"]
    pins.put(first.cache.source.rsplit("/", 1)[-1], MANIFEST, "tpu7x-w0")
    steps = _run(recipe, prod, {"tpu7x-w0": _holds(MANIFEST, _given(first, MANIFEST))}, pins, hosts=TPU7X)
    leader = prod.host("tpu7x-w0").address
    assert steps["tpu7x-w0"].serves == tuple(prod.host(h).address for h in TPU7X[1:])
    for h in TPU7X[1:]:
        place = steps[h].place
        assert place is not None
        assert place["peers"] == [{"host": "tpu7x-w0", "url": f"http://{leader}:8479"}]
        assert place["manifest"] == MANIFEST
        assert place["engine_dir"] == steps[h].cache.target


def test_in_a_rolling_change_a_shared_key_is_packed_by_rank_0_of_the_first_batch(
    prod: Inventory, tmp_path: Path
) -> None:
    two = _two_tpu7x_instances(tmp_path)
    # the second instance restarts first; its rank 0 (w4) comes after one of its workers in the run
    order = ("tpu7x-w5", "tpu7x-w4", "tpu7x-w6", "tpu7x-w7", "tpu7x-w0", "tpu7x-w1", "tpu7x-w2", "tpu7x-w3")
    batches = {h: 0 if h in TPU7X[4:] else 1 for h in TPU7X}
    steps = _run(two, prod, {}, Pins(tmp_path), starts=TPU7X, hosts=order, batches=batches)
    assert [h for h in order if steps[h].pack] == ["tpu7x-w4"]
    # the first instance's hosts, rank 0 and workers alike, start from that pack in this run
    assert steps["tpu7x-w4"].serves_packed == tuple(prod.host(h).address for h in TPU7X[:4])
    for h in TPU7X[:4]:
        receives = steps[h].receives
        assert receives is not None
        assert receives.source == "tpu7x-w4"
    # the packer's own workers compile beside it and receive it in the next run
    assert not any(steps[h].receives for h in TPU7X[4:])
