"""A folder laid out as the repository (its recipes and inventories) in which the example
recipe's checkpoints have locks and its API key is set: where ``validate`` passes what a converge
reads before connecting, so a test can look at the rest.

The example recipe pins checkpoints of the Hub (moonshotai/Kimi-K3.1-Pro, its draft) whose locks
``kimi-deploy lock`` makes against the Hub; this machine cannot reach it, so the locks here are the
tests' own input: the shape ``read_lock`` reads, the architecture the recipe serves, 96 shards of
made-up digests. No deploy reads them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.weights.lockfile import lock_path
from tests.conftest import RECIPE, ROOT

# the key the example recipe's exposed topologies read (expose.api_key: {env: KIMI_API_KEY})
API_KEY_ENV = {"KIMI_API_KEY": "tests-key"}


def _made_up_lock(repo: str, revision: str, shards: int, architecture: str) -> dict[str, object]:
    files: dict[str, object] = {
        f"model-{i:05d}-of-{shards:05d}.safetensors": {"size": 1, "digest": "sha256:" + f"{i:064x}"}
        for i in range(1, shards + 1)
    }
    files["config.json"] = {"size": 2, "digest": "gitblob:" + "0" * 40}
    config = {"architectures": [architecture], "model_type": "kimi_k3"}
    return {"repo": repo, "revision": revision, "files": files, "config": config}


def write_locks(folder: Path, recipe_file: str | Path) -> None:
    """Made-up locks, under ``folder``, for every checkpoint of ``recipe_file`` that has none
    there, naming the architectures the recipe names."""
    recipe = load_recipe(str(recipe_file))
    for _, checkpoint in recipe.all_checkpoints():
        path = folder / lock_path(checkpoint)
        if path.exists():
            continue
        architecture = checkpoint.architecture or recipe.model.architecture or "KimiK3ForConditionalGeneration"
        lock = _made_up_lock(checkpoint.repo, checkpoint.revision, checkpoint.shards, architecture)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(lock), encoding="utf-8")


def locked_site(tmp_path: Path, *recipes: str | Path) -> Path:
    """``tmp_path/site``: the repository's recipes (their locks, and made-up ones for the example
    recipe's checkpoints and those of ``recipes``) and inventories; run the CLI there with
    ``API_KEY_ENV``."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "recipes", site / "recipes")
    (site / "inventories").symlink_to(ROOT / "inventories")
    for recipe in (ROOT / RECIPE, *recipes):
        write_locks(site, recipe)
    return site
