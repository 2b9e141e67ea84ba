"""The model is checked against the engine release that will serve it: a topology whose release's
model registry (its catalog's ``architectures``) lacks the checkpoint's architecture is refused in
one line, the recipe's architecture must agree with the one its weights' lock recorded, and the
lock records what the Hub shows of config.json."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases import catalog as catalog_module
from kimi_deploy.releases.catalog import load_catalog
from kimi_deploy.releases.servability import check_servable, closest, model_architecture
from kimi_deploy.weights.hub_lock import make_lock
from kimi_deploy.weights.lockfile import Lock, LockedFile, lock_path, read_lock
from localcluster import hub_repo
from localcluster.hub import HubServer, serve
from localcluster.hub_repo import Commit
from tests.cli_run import kimi
from tests.conftest import RECIPE, ROOT
from tests.locked_site import API_KEY_ENV, write_locks

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

KIMI_K3 = "KimiK3ForConditionalGeneration"
# A TPU topology on sglang-jax, as the production inventory's tpu7x group holds it.
TPU = {
    "engine": "sglang-jax",
    "group": "tpu7x",
    "accelerators": {"vendor": "tpu", "model": "TPU7x", "per_host": 4, "memory_gib": 178},
    "max_model_len": 262144,
    "pools": {"serve": {"group": "tpu7x", "role": "serve", "hosts": 8, "parallel": {"tp": 32, "ep": 8}}},
}
ENGINES = {
    "vllm": {"version": "0.34.0", "packages": {"fastsafetensors": "0.5.0"}},
    "sglang-jax": {"version": "0.1.0rc0", "packages": {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}},
}
TPU_REFUSAL = (
    "topologies.tpu7x: sglang-jax 0.1.0rc0 does not register KimiK3ForConditionalGeneration (registers "
    "KimiK25ForConditionalGeneration, KimiLinearForCausalLM, DeepseekV3ForCausalLM, DeepseekV2ForCausalLM); "
    "served on nvidia by vllm 0.34.0"
)


@pytest.fixture(autouse=True)
def _fresh_catalogs() -> Iterator[None]:
    load_catalog.cache_clear()
    yield
    load_catalog.cache_clear()


def recipe_file(folder: Path, architecture: str | None) -> Path:
    """The production recipe with a vLLM single-node topology and a sglang-jax TPU one, naming
    ``architecture`` (None: no field), in ``folder/recipes/kimi.yaml``."""
    data: dict[str, Any] = yaml.safe_load((ROOT / RECIPE).read_text(encoding="utf-8"))
    data.pop("os", None)
    data["engines"] = ENGINES
    data["routers"], data["stores"] = {}, {}
    data["topologies"] = {"single-node": data["topologies"]["single-node"], "tpu7x": TPU}
    data["model"].pop("architecture", None)
    if architecture is not None:
        data["model"]["architecture"] = architecture
    path = folder / "recipes" / "kimi.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def inventory_file(folder: Path) -> Path:
    """The production inventory's hosts of the single-node and tpu7x topologies, with its group data."""
    path = folder / "inventories" / "prod.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "inventories" / "group_data", path.parent / "group_data")
    path.write_text(
        'b300 = [("b300-01", {"ssh_hostname": "10.20.0.11", "kimi_address": "10.21.0.11"})]\n'
        'tpu7x = [(f"tpu7x-w{i}", {"ssh_hostname": f"10.60.0.{10 + i}", "kimi_address": f"10.61.0.{10 + i}"})'
        " for i in range(8)]\n",
        encoding="utf-8",
    )
    return path


def recipe_with(folder: Path, architecture: str | None) -> tuple[Recipe, str]:
    path = recipe_file(folder, architecture)
    return load_recipe(path), str(path)


def write_lock(base: Path, recipe: Recipe, config: dict[str, Any] | None) -> Path:
    """A lock of the recipe's revision under ``base``, with ``config`` as its config record."""
    data: dict[str, Any] = {
        "repo": recipe.model.repo,
        "revision": recipe.model.revision,
        "total_bytes": 2,
        "files": {"config.json": {"size": 2, "digest": "gitblob:" + "0" * 40}},
    }
    if config is not None:
        data["config"] = config
    path = lock_path(recipe.model, base)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def refusal(recipe: Recipe, file: str, topology: str, base: Path) -> str | None:
    try:
        check_servable(recipe, file, topology, base)
    except ConfigError as exc:
        return str(exc)
    return None


def test_an_architecture_the_release_does_not_register_is_refused_in_one_line(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, KIMI_K3)
    assert refusal(recipe, file, "tpu7x", tmp_path) == f"{file}: {TPU_REFUSAL}"
    assert refusal(recipe, file, "single-node", tmp_path) is None


def test_validate_refuses_the_topology(tmp_path: Path) -> None:
    path = recipe_file(tmp_path, KIMI_K3)
    write_locks(tmp_path, path)
    run = kimi("validate", str(path), str(inventory_file(tmp_path)), cwd=tmp_path, env=API_KEY_ENV)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr == f"{path}: {TPU_REFUSAL}\n"


def test_an_architecture_every_release_registers_passes(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, "LlamaForCausalLM")
    assert refusal(recipe, file, "tpu7x", tmp_path) is None
    assert refusal(recipe, file, "single-node", tmp_path) is None
    path = recipe_file(tmp_path, "LlamaForCausalLM")
    write_locks(tmp_path, path)
    run = kimi("validate", str(path), str(inventory_file(tmp_path)), cwd=tmp_path, env=API_KEY_ENV)
    assert run.returncode == 0, run.stderr
    assert "9 hosts in single-node, tpu7x" in run.stdout


def test_a_model_of_no_known_architecture_is_not_checked(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, None)
    assert model_architecture(recipe, file, tmp_path) is None
    assert refusal(recipe, file, "tpu7x", tmp_path) is None


def test_the_refusal_lifts_once_the_pinned_release_registers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalogs = tmp_path / "catalogs"
    shutil.copytree(catalog_module.CATALOG_DIR, catalogs)
    jax = catalogs / "sglang-jax-0.1.0rc0.json"
    data = json.loads(jax.read_text(encoding="utf-8"))
    data["registries"]["architectures"] = sorted([*data["registries"]["architectures"], KIMI_K3])
    jax.write_text(json.dumps(data), encoding="utf-8")
    monkeypatch.setattr(catalog_module, "CATALOG_DIR", catalogs)
    recipe, file = recipe_with(tmp_path, KIMI_K3)
    assert refusal(recipe, file, "tpu7x", tmp_path) is None


def test_the_lock_names_the_architecture_when_the_recipe_does_not(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, None)
    write_lock(tmp_path, recipe, {"architectures": [KIMI_K3], "model_type": "kimi_k3"})
    assert model_architecture(recipe, file, tmp_path) == KIMI_K3
    assert refusal(recipe, file, "tpu7x", tmp_path) == f"{file}: {TPU_REFUSAL}"


def test_a_recipe_that_disagrees_with_its_lock_is_refused(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, KIMI_K3)
    path = write_lock(tmp_path, recipe, {"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3"})
    expected = (
        f"{file}: model.architecture: {KIMI_K3} is not the checkpoint's: config.json at "
        f"{recipe.model.revision} names KimiK3ForCausalLM ({path})"
    )
    # refused for every topology, also one whose release registers the recipe's name
    assert refusal(recipe, file, "single-node", tmp_path) == expected
    assert refusal(recipe, file, "tpu7x", tmp_path) == expected


def test_validate_names_a_disagreement_with_the_lock_once(tmp_path: Path) -> None:
    """Not once per topology: the architecture is the model's, read once."""
    recipe, _ = recipe_with(tmp_path, KIMI_K3)
    write_lock(tmp_path, recipe, {"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3"})
    argv = [sys.executable, "-m", "kimi_pyinfra.cli", "validate", "recipes/kimi.yaml", str(inventory_file(tmp_path))]
    run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [
        f"recipes/kimi.yaml: model.architecture: {KIMI_K3} is not the checkpoint's: config.json at "
        f"{recipe.model.revision} names KimiK3ForCausalLM (recipes/locks/{recipe.model.dir_name}@"
        f"{recipe.model.revision}.json)"
    ]


def test_a_lock_from_before_config_was_recorded_is_valid(tmp_path: Path) -> None:
    recipe, file = recipe_with(tmp_path, KIMI_K3)
    write_lock(tmp_path, recipe, None)
    lock = read_lock(recipe.model, tmp_path)
    assert (lock.architectures, lock.model_type) == ((), None)
    assert model_architecture(recipe, file, tmp_path) == KIMI_K3
    assert lock.to_json() == Lock(lock.repo, lock.revision, lock.files).to_json()
    assert "config" not in json.loads(lock.to_json())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (["KimiK3ForConditionalGeneration"], "config"),
        ({"architectures": "KimiK3ForConditionalGeneration"}, "config.architectures"),
        ({"architectures": ["Kimi K3; rm -rf /"]}, "config.architectures"),
        ({"model_type": "kimi k3"}, "config.model_type"),
        ({"auto_map": {}}, "config.auto_map"),
    ],
)
def test_a_malformed_config_record_is_refused(tmp_path: Path, config: Any, field: str) -> None:
    recipe, _ = recipe_with(tmp_path, None)
    path = write_lock(tmp_path, recipe, config)
    with pytest.raises(ConfigError) as err:
        read_lock(recipe.model, tmp_path)
    assert str(err.value).startswith(f"{path}: {field}: ")


def test_the_lock_round_trips_its_config_record() -> None:
    files = {"config.json": LockedFile(2, "gitblob:" + "0" * 40)}
    lock = Lock("org/name", "a" * 40, files, architectures=(KIMI_K3,), model_type="kimi_k3")
    assert json.loads(lock.to_json())["config"] == {"architectures": [KIMI_K3], "model_type": "kimi_k3"}


def test_closest_names_are_the_family_and_its_lineage() -> None:
    registered = ("LlamaForCausalLM", "KimiLinearForCausalLM", "DeepseekV3ForCausalLM", "Qwen3ForCausalLM")
    assert closest(KIMI_K3, registered) == ["KimiLinearForCausalLM", "DeepseekV3ForCausalLM"]
    # the family's own first, the one of the same model part ahead of the rest
    kimi = ("DeepseekV3ForCausalLM", "KimiLinearForCausalLM", "KimiK25ForConditionalGeneration", KIMI_K3)
    assert closest("KimiK3ForCausalLM", kimi) == [
        KIMI_K3,
        "KimiK25ForConditionalGeneration",
        "KimiLinearForCausalLM",
        "DeepseekV3ForCausalLM",
    ]
    # no family in common: the names most alike, if any
    assert closest("GemmaForCausalLM", registered) == [
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "KimiLinearForCausalLM",
        "DeepseekV3ForCausalLM",
    ]
    assert closest("Zz", registered) == []


# ---- the lock records config.json's architectures, as the Hub shows them ------------------------

REPO_ID = "org/model"


def write_repo(root: Path, config: bytes) -> str:
    """Repo ``REPO_ID`` holding ``config.json`` and one shard, written as the cluster's Hub holds
    its repositories (``localcluster.hub_repo``); its commit."""
    files = {"config.json": config, "model.safetensors": b"\0" * 16}
    info = hub_repo.write_repo(
        root,
        REPO_ID,
        [Commit("c", 1767225600, "c", files)],
        branches={"main": "c"},
        tags={},
        build={"config": config.hex()},
        model_info={},
    )
    return info.commits["c"]


@pytest.fixture
def hub(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[HubServer, str]]:
    commit = write_repo(tmp_path / "hub", request.param)
    server = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        yield server, commit
    finally:
        server.stop()


def _pinned(recipe: Recipe, commit: str) -> Recipe:
    model = recipe.model.model_copy(update={"repo": REPO_ID, "revision": commit, "shards": 1})
    return recipe.model_copy(update={"model": model})


@pytest.mark.parametrize(
    "hub", [json.dumps({"architectures": [KIMI_K3], "model_type": "kimi_k3", "hidden_size": 7}).encode()], indirect=True
)
def test_make_lock_records_the_architectures(hub: tuple[HubServer, str], tmp_path: Path) -> None:
    recipe, _ = recipe_with(tmp_path, None)
    lock = make_lock(_pinned(recipe, hub[1]).model, "recipe", hub[0].url)
    assert (lock.architectures, lock.model_type) == ((KIMI_K3,), "kimi_k3")
    assert json.loads(lock.to_json())["config"] == {"architectures": [KIMI_K3], "model_type": "kimi_k3"}


@pytest.mark.parametrize("hub", [b"not json"], indirect=True)
def test_make_lock_of_a_config_the_hub_cannot_read_records_none(hub: tuple[HubServer, str], tmp_path: Path) -> None:
    recipe, _ = recipe_with(tmp_path, None)
    lock = make_lock(_pinned(recipe, hub[1]).model, "recipe", hub[0].url)
    assert (lock.architectures, lock.model_type) == ((), None)
    assert "config" not in json.loads(lock.to_json())


@pytest.mark.parametrize("hub", [json.dumps({"architectures": ["No Class"]}).encode()], indirect=True)
def test_make_lock_refuses_a_name_that_is_no_class(hub: tuple[HubServer, str], tmp_path: Path) -> None:
    recipe, _ = recipe_with(tmp_path, None)
    server, commit = hub
    with pytest.raises(ConfigError) as err:
        make_lock(_pinned(recipe, commit).model, "recipe", server.url)
    assert str(err.value) == (
        f"{server.url}: {REPO_ID}@{commit}: config.json: config.architectures: "
        "expected a list of class names, found ['No Class']"
    )
