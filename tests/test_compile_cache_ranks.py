"""Whose compile cache a rank starts from: JAX's cache, which every process of a multi-host job
reads and process 0 alone writes, has one key for every rank of a launch; the caches of vLLM and
SGLang, which each rank compiles for itself, keep a key per rank.

The example's ``tpu7x`` topology: one sglang-jax instance over eight hosts, tpu7x-w0 its node
rank 0 (``inventories/prod.py``).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from kimi_deploy.engines import engine
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan, Unit
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.render.files import render_host
from kimi_pyinfra.inventory_file import load_inventory

RECIPE = "recipes/kimi-k3.1-pro.yaml"
INVENTORY = "inventories/prod.py"
TPU7X = tuple(f"tpu7x-w{i}" for i in range(8))


def _plan(recipe_file: str = RECIPE) -> Plan:
    return plan(load_recipe(recipe_file), RECIPE, load_inventory(INVENTORY))


def _tpu7x(tmp_path: Path, edit: dict[str, object]) -> Plan:
    """The example with ``edit`` made to the tpu7x topology's serve pool."""
    data = yaml.safe_load(Path(RECIPE).read_text(encoding="utf-8"))
    data["topologies"]["tpu7x"]["pools"]["serve"] |= edit
    changed = tmp_path / "recipe.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    return _plan(str(changed))


def _engine(full: Plan, host: str) -> Unit:
    return next(u for u in full.for_host(host).units if u.kind == "engine")


def _key(full: Plan, host: str) -> str:
    cache = _engine(full, host).compile_cache
    assert cache is not None
    return cache.key


def test_the_jax_engines_declare_that_their_ranks_share_one_cache() -> None:
    assert engine("sglang-jax").compile_cache_ranks == "shared"
    assert engine("vllm-tpu").compile_cache_ranks == "shared"
    assert engine("vllm").compile_cache_ranks == "each"
    assert engine("sglang").compile_cache_ranks == "each"


def test_every_rank_of_the_tpu7x_instance_has_one_key() -> None:
    full = _plan()
    assert [full.for_host(h).node_rank for h in TPU7X] == list(range(8))
    assert len({_key(full, h) for h in TPU7X}) == 1
    # ... and one artifact, which every host of the instance names
    assert len({str(_engine(full, h).compile_cache) for h in TPU7X}) == 1


def test_the_ranks_launches_differ_only_in_the_rank_and_the_hosts_name() -> None:
    """What the key leaves out is all that differs between the ranks' rendered units: any other
    word of a rank's launch, in its command line or its environment, would be compiled for."""
    recipe = load_recipe(RECIPE)
    full = _plan()
    unit = _engine(full, "tpu7x-w0").name
    paths = (f"/etc/systemd/system/{unit}.service", f"/etc/kimi/{unit}.env")

    def rendered(host: str) -> dict[str, list[str]]:
        files = {f.path: f.content for f in render_host(recipe, full.for_host(host))}
        return {p: files[p].replace(host, "<host>").splitlines() for p in paths}

    leader = rendered("tpu7x-w0")
    for host in TPU7X[1:]:
        rank = full.for_host(host).node_rank
        worker = rendered(host)
        for path in paths:
            assert len(worker[path]) == len(leader[path])
            differ = [(a, b) for a, b in zip(leader[path], worker[path], strict=True) if a != b]
            # its name in the unit's description, and the rank it is given
            names = [(a, b) for a, b in differ if a.startswith("Description=")]
            assert all(a.endswith("leader rank 0)") and b.endswith(f"worker rank {rank})") for a, b in names)
            ranks = [(a.strip(), b.strip()) for a, b in differ if not a.startswith("Description=")]
            expected = [("--node-rank 0 \\", f"--node-rank {rank} \\")] if path.endswith(".service") else []
            assert ranks == expected
        assert _key(full, host) == _key(full, "tpu7x-w0")


def test_the_instances_of_one_launch_share_the_key_and_another_launch_has_another(tmp_path: Path) -> None:
    one = _plan()
    # the same eight hosts as two instances of TP=16 chips, four hosts each
    two = _tpu7x(tmp_path, {"instances": 2, "parallel": {"tp": 16, "ep": 8}})
    assert [two.for_host(h).instance for h in TPU7X] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [two.for_host(h).node_rank for h in TPU7X] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert len({_key(two, h) for h in TPU7X}) == 1
    assert _key(two, "tpu7x-w0") != _key(one, "tpu7x-w0")


def test_a_shared_key_still_changes_with_what_changes_the_compiled_code(tmp_path: Path) -> None:
    before = _plan()
    data = yaml.safe_load(Path(RECIPE).read_text(encoding="utf-8"))
    data["topologies"]["tpu7x"]["max_model_len"] = 131072
    changed = tmp_path / "recipe.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    after = _plan(str(changed))
    assert {_key(after, h) for h in TPU7X} != {_key(before, h) for h in TPU7X}
    assert len({_key(after, h) for h in TPU7X}) == 1


def test_the_ranks_of_a_vllm_multi_node_instance_keep_keys_of_their_own() -> None:
    full = _plan()
    # gb300-pd's prefill instances span two hosts: rank 0 and rank 1 compile for themselves
    assert [full.for_host(h).node_rank for h in ("gb300-p01", "gb300-p02")] == [0, 1]
    assert _key(full, "gb300-p01") != _key(full, "gb300-p02")
    # hosts of one rank in the pool's other instances still share it
    assert _key(full, "gb300-p02") == _key(full, "gb300-p04") == _key(full, "gb300-p06")
