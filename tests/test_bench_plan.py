"""What the serving benchmark sends, from which host, to which endpoint (kimi_deploy/benchmark/plan.py):
the demo's real-vLLM topology alone, and behind the router and gateway as the end-to-end tests
serve it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.benchmark.plan import HOSTED_KEY, bench_request, generator, hosted, local_target, rows
from kimi_deploy.hostside import bench_load
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.conftest import ROOT

ROUTED = """
_c = {"ssh_user": "root", "kimi_recipe": "recipe.yaml"}
_hosts = [("kimi-h1", {"ssh_hostname": "10.213.7.11", **_c}), ("kimi-h2", {"ssh_hostname": "10.213.7.12", **_c}),
          ("kimi-h3", {"ssh_hostname": "10.213.7.13", **_c})]
demo_vllm = _hosts[:2]
demo_router = _hosts[2:3]
demo_routed = _hosts[:3]
"""


def _recipe(tmp_path: Path, routed: bool, bind: str = "address", **bench: Any) -> tuple[Recipe, str]:
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    vllm = data["topologies"]["demo-vllm"]
    data["topologies"] = {"demo-vllm": vllm}
    key = tmp_path / "api-key"
    key.write_text("client-key-0123\n", encoding="utf-8")
    if bind == "loopback":
        del vllm["expose"]
    else:
        vllm["expose"] = {"bind": bind, "api_key": {"file": str(key)}}
    if routed:
        vllm["group"] = "demo_routed"
        vllm["router"] = {"group": "demo_router", "package": "vllm-router"}
    data["benchmark"] |= bench
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_recipe(path), str(path)


def _topology(tmp_path: Path, recipe: Recipe, recipe_file: str, routed: bool) -> tuple[HostPlan, ...]:
    inventory = tmp_path / "inventory.py"
    if routed:
        inventory.write_text(ROUTED.replace("recipe.yaml", recipe_file), encoding="utf-8")
    else:
        inventory.write_text(
            f'_c = {{"ssh_user": "root", "kimi_recipe": "{recipe_file}"}}\n'
            'demo_vllm = [("kimi-h1", {"ssh_hostname": "10.213.7.11", **_c}), '
            '("kimi-h2", {"ssh_hostname": "10.213.7.12", **_c})]\n',
            encoding="utf-8",
        )
    whole = plan(recipe, recipe_file, load_inventory(str(inventory)))
    return whole.topology("demo-vllm")


def test_each_level_sends_every_task_in_order_at_least_twice_its_concurrency() -> None:
    bench = load_recipe(ROOT / "recipes/demo.yaml").benchmark
    assert bench is not None
    assert len(bench.tasks) == 5
    assert rows(bench, 1) == [0, 1, 2, 3, 4]
    assert rows(bench, 4) == [0, 1, 2, 3, 4] * 2
    assert rows(bench, 16) == [0, 1, 2, 3, 4] * 7
    assert rows(bench.model_copy(update={"rounds": 3}), 1) == [0, 1, 2, 3, 4] * 3


def test_without_a_router_the_generator_drives_its_own_hosts_engine(tmp_path: Path) -> None:
    recipe, path = _recipe(tmp_path, routed=False)
    topology = _topology(tmp_path, recipe, path, routed=False)
    at = generator(topology)
    assert at is not None
    assert at.host == "kimi-h1"
    target = local_target(recipe, topology, at)
    assert (target.url, target.model) == ("http://10.213.7.11:8000", "kimi-local")
    # the key as the host holds it: the engine's secret environment file
    assert (target.key_file, target.key_var) == ("/etc/kimi/secrets/kimi-vllm.env", "VLLM_API_KEY")


def test_behind_a_router_the_generator_goes_through_the_gateway_as_clients_do(tmp_path: Path) -> None:
    recipe, path = _recipe(tmp_path, routed=True)
    topology = _topology(tmp_path, recipe, path, routed=True)
    at = generator(topology)
    assert at is not None
    assert at.host == "kimi-h1"
    assert local_target(recipe, topology, at).url == "http://10.213.7.13:8000"


def test_a_gateway_on_every_address_is_reached_at_its_hosts_address(tmp_path: Path) -> None:
    recipe, path = _recipe(tmp_path, routed=True, bind="0.0.0.0")
    topology = _topology(tmp_path, recipe, path, routed=True)
    at = generator(topology)
    assert at is not None
    assert local_target(recipe, topology, at).url == "http://10.213.7.13:8000"


def test_an_engine_on_loopback_is_driven_from_its_own_host(tmp_path: Path) -> None:
    recipe, path = _recipe(tmp_path, routed=False, bind="loopback")
    topology = _topology(tmp_path, recipe, path, routed=False)
    at = generator(topology)
    assert at is not None
    target = local_target(recipe, topology, at)
    assert (target.url, target.key_file) == ("http://127.0.0.1:8000", None)


def test_the_hosted_api_is_the_compare_entry_or_else_the_router_fallback(tmp_path: Path) -> None:
    recipe, path = _recipe(tmp_path, routed=True)
    assert hosted(recipe) is None
    fallback = {"url": "https://api.example.com/v1", "api_key": {"env": "HOSTED_KEY"}, "model": "kimi-k3.1"}
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    data["topologies"]["demo-vllm"]["router"]["fallback"] = fallback
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    found = hosted(load_recipe(path))
    assert found is not None
    assert (found.url, found.model) == ("https://api.example.com/v1", "kimi-k3.1")
    data["benchmark"]["compare"] = {**fallback, "url": "https://other.example.com", "model": "other"}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    found = hosted(load_recipe(path))
    assert found is not None
    assert found.model == "other"


def test_the_request_names_where_keys_are_and_holds_none(tmp_path: Path) -> None:
    compare = {"url": "https://api.example.com/v1/", "api_key": {"file": str(tmp_path / "api-key")}, "model": "m"}
    recipe, path = _recipe(tmp_path, routed=True, compare=compare)
    topology = _topology(tmp_path, recipe, path, routed=True)
    at = generator(topology)
    assert at is not None
    request = bench_request(recipe, topology, at, "run-1")
    assert "client-key-0123" not in json.dumps(request)
    assert request["targets"] == [
        {
            "name": "local",
            "url": "http://10.213.7.13:8000",
            "model": "kimi-local",
            "key_file": "/etc/kimi/secrets/kimi-vllm.env",
            "key_var": "VLLM_API_KEY",
        },
        {"name": "hosted", "url": "https://api.example.com/v1", "model": "m", "key_file": HOSTED_KEY, "key_var": None},
    ]
    assert request["remove"] == [HOSTED_KEY]
    assert request["python"] == f"{at.engine_dir}/bin/python"
    assert request["tokenizer"] == at.model_dir
    assert request["trust_remote_code"] is recipe.model.trust_remote_code
    assert request["engine"] == {
        "unit": "kimi-vllm",
        "url": "http://10.213.7.11:8000",
        "nvidia": False,
        "key_file": "/etc/kimi/secrets/kimi-vllm.env",
        "key_var": "VLLM_API_KEY",
        "kv_metrics": ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    }
    assert [level["concurrency"] for level in request["levels"]] == [1, 4, 16]


@pytest.mark.parametrize("trusted", [True, False])
def test_the_generator_loads_a_remote_code_tokenizer_only_where_the_recipe_trusts_it(trusted: bool) -> None:
    # Kimi's tokenizer is its own code: without the flag, vllm bench serve fails every request.
    req = {"tokenizer": "/srv/models/m/rev", "trust_remote_code": trusted}
    target = {"url": "http://127.0.0.1:8000", "model": "kimi-local"}
    argv = bench_load._argv(req, target, concurrency=4, name="local-4", work="/w", results="/r", n=8)
    assert ("--trust-remote-code" in argv) is trusted
    assert argv[argv.index("--tokenizer") + 1] == "/srv/models/m/rev"
