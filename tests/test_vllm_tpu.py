"""vLLM's TPU build (vllm-tpu 0.32.0 over tpu-inference 0.32.0) as a TPU engine: the example recipe
(Kimi K2.6 on one TPU7x host) validates, plans and renders; its unit's flags are the release's
(the committed catalog, read from the wheels); tensor parallel counts JAX devices; what it cannot
serve is refused in one line, Kimi K3 among it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.engines import vllm_tpu
from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe, recipe_from
from kimi_deploy.releases.catalog import load_catalog
from kimi_deploy.releases.servability import check_servable
from kimi_deploy.render.files import render_host
from kimi_pyinfra.inventory_file import load_inventory
from tests.cli_run import kimi
from tests.conftest import ROOT
from tests.locked_site import API_KEY_ENV, locked_site

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

RECIPE = "recipes/examples/kimi-k2.6-tpu7x.yaml"
INVENTORY = "inventories/examples/kimi-k2.6-tpu7x.py"
HOST = "tpu7x-k26-w0"
VENV = "/opt/kimi/engines/vllm-tpu-0.32.0+jax-0.11.2+jaxlib-0.11.2+libtpu-0.0.48"
MODEL = "/srv/models/moonshotai--Kimi-K2.6/7eb5002f6aadc958aed6a9177b7ed26bb94011bb"


@pytest.fixture(autouse=True)
def _fresh_catalogs() -> Iterator[None]:
    load_catalog.cache_clear()
    yield
    load_catalog.cache_clear()


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    return load_inventory(str(ROOT / INVENTORY))


def _data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    return data


def _recipe(change: dict[str, Any] | None = None, arch: str | None = None, size: int | None = None) -> Recipe:
    """The example recipe, its tpu7x topology updated with ``change`` (and the model's architecture
    or size), checked as ``RECIPE`` is: its release locks are the committed ones."""
    data = copy.deepcopy(_data())
    topo = data["topologies"]["tpu7x"]
    for key, value in (change or {}).items():
        topo[key] = value
    if arch is not None:
        data["model"]["architecture"] = arch
    if size is not None:
        data["model"]["size_bytes"] = size
    return recipe_from(data)


def _pool(hosts: int, parallel: dict[str, int]) -> dict[str, Any]:
    return {"serve": {"group": "tpu7x_k26_serve", "role": "serve", "hosts": hosts, "parallel": parallel}}


def test_the_example_validates_against_its_committed_release_locks(tmp_path: Path) -> None:
    run = kimi("validate", RECIPE, INVENTORY, cwd=locked_site(tmp_path, ROOT / RECIPE), env=API_KEY_ENV)
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.strip() == f"ok: {RECIPE} x {INVENTORY}: 1 host in tpu7x"


def test_the_example_plans_vllm_serve_with_tp_counting_two_devices_a_chip(inventory: Inventory) -> None:
    full = plan(load_recipe(ROOT / RECIPE), RECIPE, inventory)
    (host,) = full.hosts
    (unit,) = [u for u in host.units if u.kind == "engine"]
    assert unit.name == "kimi-vllm-tpu"
    assert list(unit.argv) == [
        f"{VENV}/bin/vllm",
        "serve",
        MODEL,
        "--served-model-name",
        "kimi-k2.6",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        # 4 TPU7x chips, 2 TensorCores (JAX devices) each
        "--tensor-parallel-size",
        "8",
        "--enable-expert-parallel",
        "--max-model-len",
        "32768",
        "--trust-remote-code",
        "--tool-call-parser",
        "kimi_k2",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "kimi_k2",
    ]
    assert unit.env["JAX_PLATFORMS"] == "tpu"
    assert unit.env["VLLM_XLA_CACHE_PATH"] == "/var/cache/kimi/kimi-vllm-tpu/xla"
    assert "GLOO_SOCKET_IFNAME" not in unit.env  # JAX, not torch.distributed, joins the devices
    assert unit.secret_env == ()


def test_the_example_renders_its_unit(inventory: Inventory) -> None:
    recipe = load_recipe(ROOT / RECIPE)
    (host,) = plan(recipe, RECIPE, inventory).hosts
    files = {f.path: f.content for f in render_host(recipe, host)}
    service = files["/etc/systemd/system/kimi-vllm-tpu.service"]
    assert f"ExecStart={VENV}/bin/vllm serve {MODEL} " in service


def test_plan_prints_the_unit() -> None:
    run = kimi("plan", RECIPE, INVENTORY)
    assert run.returncode == 0, run.stderr
    assert "topology tpu7x: 1 hosts, vllm-tpu 0.32.0" in run.stdout
    assert "--tensor-parallel-size 8 --enable-expert-parallel" in run.stdout


def test_every_flag_the_unit_emits_is_in_the_release_catalog(inventory: Inventory) -> None:
    catalog = load_catalog("vllm-tpu", "0.32.0")
    assert catalog.launch == ("vllm", "serve")
    for change in ({}, {"pools": _pool(1, {"tp": 2, "dp": 2, "ep": 4})}, {"load_format": "safetensors"}):
        for host in plan(_recipe(change), RECIPE, inventory).hosts:
            for unit in host.units:
                if unit.kind == "engine":
                    assert catalog.problems(unit.argv, vllm_tpu.positionals(catalog)) == []


def test_data_parallel_ranks_each_take_their_chips_devices(inventory: Inventory) -> None:
    # each of the two ranks holds a whole copy of a (smaller) model on its 2 chips
    (host,) = plan(_recipe({"pools": _pool(1, {"tp": 2, "dp": 2})}, size=300 * 10**9), RECIPE, inventory).hosts
    (unit,) = [u for u in host.units if u.kind == "engine"]
    argv = list(unit.argv)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" not in argv


def test_the_catalog_registers_what_loads_on_a_tpu() -> None:
    registered = load_catalog("vllm-tpu", "0.32.0").registries["architectures"]
    # tpu-inference's JAX models, and vLLM's under torchax: Kimi K2.5/K2.6 is one of them
    assert {"DeepseekV3ForCausalLM", "Qwen3ForCausalLM", "KimiK25ForConditionalGeneration"} <= set(registered)
    # vllm/models/kimi_k3/__init__.py binds no class on a TPU
    assert "KimiK3ForConditionalGeneration" not in registered


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (
            {"pools": _pool(2, {"tp": 8, "ep": 8})},
            "topologies.tpu7x.pools.serve.hosts: vllm-tpu spans hosts only on a Ray cluster "
            "(TPU_MULTIHOST_BACKEND=ray), which kimi-deploy does not run: expected 1 host per instance, found 2",
        ),
        (
            {"pools": _pool(1, {"tp": 4, "ep": 2})},
            "topologies.tpu7x.pools.serve.parallel: vllm-tpu expert parallel spans tp*dp = 4 chips, found ep 2",
        ),
        (
            {"pools": _pool(1, {"tp": 2, "pp": 2})},
            "topologies.tpu7x.pools.serve.parallel: vllm-tpu pipeline parallel is not planned, found pp 2",
        ),
    ],
)
def test_a_layout_it_cannot_serve_is_refused_in_one_line(
    tmp_path: Path, inventory: Inventory, change: dict[str, Any], line: str
) -> None:
    if change["pools"]["serve"]["hosts"] > 1:
        inventory = load_inventory(str(_two_hosts(tmp_path)))
    with pytest.raises(ConfigError) as err:
        plan(_recipe(change), RECIPE, inventory)
    assert str(err.value) == f"{RECIPE}: {line}"
    assert "\n" not in str(err.value)


def _two_hosts(tmp_path: Path) -> Path:
    inv = tmp_path / "two.py"
    inv.write_text(
        "tpu7x_k26_serve = [\n"
        '    ("tpu7x-k26-w0", {"ssh_hostname": "10.62.0.10", "kimi_address": "10.63.0.10"}),\n'
        '    ("tpu7x-k26-w1", {"ssh_hostname": "10.62.0.11", "kimi_address": "10.63.0.11"}),\n'
        "]\n"
        "tpu7x_k26 = [name for name, _ in tpu7x_k26_serve]\n",
        encoding="utf-8",
    )
    return inv


def test_kimi_k3_on_vllm_tpu_is_refused_by_the_servability_rule() -> None:
    with pytest.raises(ConfigError) as err:
        check_servable(_recipe(arch="KimiK3ForConditionalGeneration"), RECIPE, "tpu7x")
    line = str(err.value)
    assert line.startswith(
        f"{RECIPE}: topologies.tpu7x: vllm-tpu 0.32.0 does not register KimiK3ForConditionalGeneration (registers "
    )
    assert "KimiK25ForConditionalGeneration" in line
    assert line.endswith("; no topology of the recipe serves it")
    assert "\n" not in line
