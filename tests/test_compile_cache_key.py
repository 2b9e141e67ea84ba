"""The compile cache's key: the same for hosts that compile the same code, another for anything
that changes the code, and the unit binds only the artifact of its own key."""

from __future__ import annotations

from pathlib import Path

import yaml

from kimi_deploy.compile_cache.key import CACHES_ROOT
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan, Unit
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases.host_paths import unit_cache_dir
from kimi_deploy.render.files import render_host
from kimi_pyinfra.inventory_file import load_inventory

RECIPE = "recipes/kimi-k3.1-pro.yaml"
INVENTORY = "inventories/prod.py"


def _plan(recipe_file: str = RECIPE, inventory: str = INVENTORY) -> Plan:
    return plan(load_recipe(recipe_file), recipe_file, load_inventory(inventory))


def _engine(full: Plan, host: str) -> Unit:
    return next(u for u in full.for_host(host).units if u.kind == "engine")


def _keys(full: Plan) -> dict[str, str]:
    return {h.host: u.compile_cache.key for h in full.hosts for u in h.units if u.compile_cache is not None}


def _changed(tmp_path: Path, edit: dict[str, object], topology: str = "gb300-pd") -> Plan:
    data = yaml.safe_load(Path(RECIPE).read_text(encoding="utf-8"))
    data["topologies"][topology] |= edit
    changed = tmp_path / "recipe.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    # the recipe's relative paths (catalogs, locks) stay the project's
    return plan(load_recipe(str(changed)), RECIPE, load_inventory(INVENTORY))


def test_hosts_of_the_same_rank_share_a_key_whatever_their_addresses() -> None:
    keys = _keys(_plan())
    # three prefill instances of two hosts each: the hosts of one rank compile the same code
    assert keys["gb300-p01"] == keys["gb300-p03"] == keys["gb300-p05"]
    assert keys["gb300-p02"] == keys["gb300-p04"] == keys["gb300-p06"]
    assert keys["gb300-p01"] != keys["gb300-p02"]
    # the decode pool's hosts hold other data-parallel ranks, the single node another launch
    decode = [keys[f"gb300-d0{i}"] for i in range(1, 5)]
    assert len({*decode, keys["gb300-p01"], keys["b300-01"]}) == 6


def test_anything_that_changes_the_compiled_code_changes_the_key(tmp_path: Path) -> None:
    before = _keys(_plan())
    longer = _keys(_changed(tmp_path, {"max_model_len": 262144}))
    assert longer["gb300-p01"] != before["gb300-p01"]
    # another topology's change leaves this one's keys alone
    assert longer["b300-01"] == before["b300-01"]


def test_the_unit_names_its_own_keys_artifact_and_the_engines_cache_folder() -> None:
    full = _plan()
    unit = _engine(full, "gb300-p03")
    cache = unit.compile_cache
    assert cache is not None
    assert cache.source == f"{CACHES_ROOT}/kimi-vllm-{cache.key}"
    # the folder vLLM writes its torch.compile cache in: its cache root under the unit's XDG_CACHE_HOME
    files = {f.path: f.content for f in render_host(load_recipe(RECIPE), full.for_host("gb300-p03"))}
    env = dict(line.split("=", 1) for line in files["/etc/kimi/kimi-vllm.env"].splitlines() if "=" in line)
    assert env["XDG_CACHE_HOME"] == unit_cache_dir("kimi-vllm")
    assert "VLLM_CACHE_ROOT" not in env
    assert cache.target == f"{env['XDG_CACHE_HOME']}/vllm/torch_compile_cache"


def test_an_eager_launch_compiles_nothing_and_binds_no_cache(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        '_c = {"ssh_user": "root", "kimi_recipe": "recipes/demo.yaml"}\n'
        'demo_vllm = [("kimi-h1", {"ssh_hostname": "10.213.7.11", **_c}), ("kimi-h2", {"ssh_hostname": "10.213.7.12", **_c})]\n'
        'demo_sglang = [("kimi-h3", {"ssh_hostname": "10.213.7.13", **_c}), ("kimi-h4", {"ssh_hostname": "10.213.7.14", **_c})]\n',
        encoding="utf-8",
    )
    demo = _plan("recipes/demo.yaml", str(inventory))
    unit = _engine(demo, "kimi-h1")
    assert "--enforce-eager" in unit.argv
    assert unit.compile_cache is None


def _demo_gpu(tmp_path: Path, edit: dict[str, object] | None = None) -> Plan:
    """The GPU demo recipe (its ``demo-sglang`` topology: SGLang over two hosts, TP=16), with
    ``edit`` made to that topology's serve pool's parallel sizes."""
    recipe = "recipes/demo-gpu.yaml"
    data = yaml.safe_load(Path(recipe).read_text(encoding="utf-8"))
    if edit:
        data["topologies"]["demo-sglang"]["pools"]["serve"]["parallel"] |= edit
    changed = tmp_path / "demo-gpu.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    inventory = tmp_path / "inventory.py"
    inventory.write_text(
        '_c = {"ssh_user": "root", "kimi_recipe": "recipes/demo-gpu.yaml"}\n'
        'demo_vllm = [("kimi-h1", {"ssh_hostname": "10.213.7.11", **_c}), ("kimi-h2", {"ssh_hostname": "10.213.7.12", **_c})]\n'
        'demo_sglang = [("kimi-h3", {"ssh_hostname": "10.213.7.13", **_c}), ("kimi-h4", {"ssh_hostname": "10.213.7.14", **_c})]\n',
        encoding="utf-8",
    )
    return plan(load_recipe(str(changed)), recipe, load_inventory(str(inventory)))


def test_an_sglang_unit_keeps_what_it_compiles_in_one_folder_its_env_names(tmp_path: Path) -> None:
    demo = _demo_gpu(tmp_path)
    unit = _engine(demo, "kimi-h3")
    cache = unit.compile_cache
    assert cache is not None
    assert cache.source == f"{CACHES_ROOT}/kimi-sglang-{cache.key}"
    # the folder SGLang writes DeepGEMM's, Triton's, inductor's and its own caches in, under the
    # unit's cache folder; its JIT kernels and FlashInfer's workspace named inside it
    env = unit.env
    assert env["SGLANG_CACHE_DIR"] == cache.target
    assert cache.target.startswith(f"{unit_cache_dir('kimi-sglang')}/")
    assert env["SGLANG_JIT_CACHE_DIR"].startswith(f"{cache.target}/")
    assert env["FLASHINFER_WORKSPACE_BASE"].startswith(f"{cache.target}/")
    # as the host gets it: the rendered env file names the same folders
    files = {f.path: f.content for f in render_host(load_recipe("recipes/demo-gpu.yaml"), demo.for_host("kimi-h3"))}
    rendered = dict(line.split("=", 1) for line in files["/etc/kimi/kimi-sglang.env"].splitlines() if "=" in line)
    assert {k: rendered[k] for k in ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")} == {
        k: env[k] for k in ("SGLANG_CACHE_DIR", "SGLANG_JIT_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")
    }


def test_an_sglang_key_changes_with_the_parallel_layout_and_the_rank(tmp_path: Path) -> None:
    before = _keys(_demo_gpu(tmp_path))
    # the two hosts of one TP=16 instance hold other ranks: other kernels' callers, other keys
    assert before["kimi-h3"] != before["kimi-h4"]
    # the same sixteen GPUs as two data-parallel ranks of TP=8: another launch, another key
    narrower = _keys(_demo_gpu(tmp_path, {"tp": 8, "dp": 2}))
    assert narrower["kimi-h3"] != before["kimi-h3"]
    assert _keys(_demo_gpu(tmp_path, {"ep": 16}))["kimi-h3"] != before["kimi-h3"]
    # the vLLM topology of the same recipe is untouched by SGLang's pool
    assert narrower["kimi-h1"] == before["kimi-h1"]


def test_the_tpu_engines_keep_jaxs_compilation_cache_in_the_folder_their_env_names() -> None:
    tpu = _engine(_plan(), "tpu7x-w0")
    assert tpu.compile_cache is not None
    assert tpu.compile_cache.target == tpu.env["JAX_COMPILATION_CACHE_DIR"] == f"{unit_cache_dir(tpu.name)}/jax"
    example = "recipes/examples/kimi-k2.6-tpu7x.yaml"
    k26 = _plan(example, "inventories/examples/kimi-k2.6-tpu7x.py")
    vllm_tpu = _engine(k26, k26.hosts[0].host)
    assert vllm_tpu.compile_cache is not None
    assert (
        vllm_tpu.compile_cache.target == vllm_tpu.env["VLLM_XLA_CACHE_PATH"] == f"{unit_cache_dir(vllm_tpu.name)}/xla"
    )


def test_a_tokenspeed_unit_points_every_librarys_cache_into_one_folder() -> None:
    full = _plan()
    keys = _keys(full)
    # the two ranks of tokenspeed-multi compile their own parts, the single host another launch
    assert len({keys["h200-01"], keys["h200-02"], keys["b300-02"]}) == 3
    unit = _engine(full, "h200-01")
    cache = unit.compile_cache
    assert cache is not None
    assert cache.source == f"{CACHES_ROOT}/kimi-tokenspeed-{cache.key}"
    assert cache.target.startswith(f"{unit_cache_dir('kimi-tokenspeed')}/")
    # DeepGEMM's, FlashInfer's, Triton's, its autotune results and its C++ extensions: each
    # library's own variable names a folder inside the one the cache is made from, none the same
    names = (
        "DG_JIT_CACHE_DIR",
        "FLASHINFER_WORKSPACE_BASE",
        "TRITON_CACHE_DIR",
        "TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR",
        "TORCH_EXTENSIONS_DIR",
    )
    folders = [unit.env[name] for name in names]
    assert all(folder.startswith(f"{cache.target}/") for folder in folders)
    assert len(set(folders)) == len(folders)
    # as the host gets it: the rendered env file names the same folders
    files = {f.path: f.content for f in render_host(load_recipe(RECIPE), full.for_host("h200-01"))}
    rendered = dict(line.split("=", 1) for line in files["/etc/kimi/kimi-tokenspeed.env"].splitlines() if "=" in line)
    assert [rendered[name] for name in names] == folders
