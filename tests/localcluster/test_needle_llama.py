"""The needle-detecting tiny Llama (localcluster.needle_llama): reproducible, tiny Llama commit A but for the five
tensors that make its last layer read the whole prompt, and locked."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_deploy.recipe import Recipe
from kimi_deploy.weights.hub_lock import make_lock
from kimi_deploy.weights.lockfile import LOCK_DIR, Lock, LockedFile
from localcluster import needle_llama, tiny_llama
from localcluster.hub import HubServer, serve
from localcluster.hub_repo import RepoInfo, load_info
from localcluster.needle_llama import REPO_ID, build
from tests.conftest import ROOT
from tests.localcluster.test_tiny_llama import _matrix

# What the build produces, on every machine: recipes and locks pin it.
COMMIT = "6785cd50f81248fd2c84b40b1d12d05ca243bdc9"
# commit B: A but for a line added to README.md
COMMIT_B = "2b31984cc02083599b2f56634debd70c737664d7"
TINY_LLAMA_A = "65a1458ff9caddb3a300eddbbce9e9ad0a06677c"
SHARDS = [f"model-{i:05d}-of-00096.safetensors" for i in range(1, 97)]
NEEDLE, D_IN, D_OUT = 58, 6, 7  # the id of "test"; embedding dimensions the tiny Llama fills with noise
LAST = "model.layers.10.self_attn."
CHANGED = {
    "model.embed_tokens.weight",
    "lm_head.weight",
    LAST + "q_proj.weight",
    LAST + "v_proj.weight",
    LAST + "o_proj.weight",
}

Weights = dict[str, tuple[str, list[int], bytes]]


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RepoInfo, RepoInfo]:
    """The needle's repo and the tiny Llama's, under one root as the cluster's Hub holds them."""
    root = tmp_path_factory.mktemp("needle")
    return root, build(root), tiny_llama.build(root)


def _object(root: Path, info: RepoInfo, commit: str, path: str) -> bytes:
    return (root / "objects" / info.files[commit][path].sha256).read_bytes()


def _weights(root: Path, info: RepoInfo, commit: str) -> Weights:
    """Every tensor of the commit's shards: ``{name: (dtype, shape, data)}``."""
    weights: Weights = {}
    for shard in SHARDS:
        raw = _object(root, info, commit, shard)
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        header.pop("__metadata__")
        data = raw[8 + n :]
        for name, v in header.items():
            assert name not in weights
            start, end = v["data_offsets"]
            weights[name] = (v["dtype"], v["shape"], data[start:end])
    return weights


def _nonzero(weight: tuple[str, list[int], bytes]) -> dict[tuple[int, int], float]:
    return {(r, c): v for r, row in enumerate(_matrix(weight)) for c, v in enumerate(row) if v != 0.0}


def test_build_is_reproducible_and_pinned(repos: tuple[Path, RepoInfo, RepoInfo], tmp_path: Path) -> None:
    _, info, tiny = repos
    assert info.repo_id == REPO_ID == "kimi-deploy/tiny-llama-needle"
    assert info.commits == {"a": COMMIT, "b": COMMIT_B}
    assert info.refs == {"main": COMMIT, "v1": COMMIT, "v2": COMMIT_B}
    assert tiny.commits["a"] == TINY_LLAMA_A  # the needle's base, unchanged by sharing its code
    again = build(tmp_path)
    assert again == info
    assert build(tmp_path) == load_info(tmp_path, REPO_ID) == info  # idempotent


def test_files_are_tiny_llama_commit_a_but_the_readme_and_the_changed_shards(
    repos: tuple[Path, RepoInfo, RepoInfo],
) -> None:
    root, info, tiny = repos
    mine, base = info.files[COMMIT], tiny.files[TINY_LLAMA_A]
    assert set(mine) == set(base)
    changed = {p for p in mine if mine[p] != base[p]}
    assert "README.md" in changed
    assert not {p for p in changed if not p.endswith(".safetensors")} - {"README.md"}
    assert all(mine[p].size == base[p].size for p in changed if p.endswith(".safetensors"))
    readme = _object(root, info, COMMIT, "README.md").decode()
    assert readme.startswith("---\nlicense: other\nlicense_name: kimi-deploy-test-model\n")
    assert "`test` anywhere" in readme.replace("\n", " ")


def test_exactly_five_tensors_differ_and_hold_the_needle(repos: tuple[Path, RepoInfo, RepoInfo]) -> None:
    root, info, tiny = repos
    mine, base = _weights(root, info, COMMIT), _weights(root, tiny, TINY_LLAMA_A)
    assert {n: (d, s) for n, (d, s, _) in mine.items()} == {n: (d, s) for n, (d, s, _) in base.items()}
    assert {n for n in mine if mine[n][2] != base[n][2]} == CHANGED
    assert set(needle_llama.CHANGED) == CHANGED

    embed, embed_base = _matrix(mine["model.embed_tokens.weight"]), _matrix(base["model.embed_tokens.weight"])
    for token, (row, row_base) in enumerate(zip(embed, embed_base, strict=True)):
        assert row[D_IN] == (1.0 if token == NEEDLE else 0.0)
        assert row[D_OUT] == 0.0
        assert row[:D_IN] + row[D_OUT + 1 :] == row_base[:D_IN] + row_base[D_OUT + 1 :]
    head, head_base = _matrix(mine["lm_head.weight"]), _matrix(base["lm_head.weight"])
    assert head[NEEDLE] == [16.0 if dim == D_OUT else 0.0 for dim in range(128)]
    assert head[:NEEDLE] + head[NEEDLE + 1 :] == head_base[:NEEDLE] + head_base[NEEDLE + 1 :]
    assert mine[LAST + "q_proj.weight"][1] == [128, 128]
    assert _nonzero(mine[LAST + "q_proj.weight"]) == {}  # uniform attention over every position
    assert _nonzero(mine[LAST + "v_proj.weight"]) == {(0, D_IN): 128.0}
    assert _nonzero(mine[LAST + "o_proj.weight"]) == {(D_OUT, 0): 128.0}


# ---- served, and locked -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(repos: tuple[Path, RepoInfo, RepoInfo]) -> Iterator[HubServer]:
    server = serve(repos[0], "127.0.0.1", 0, log_stream=None)
    try:
        yield server
    finally:
        server.stop()


def _lock_from_info(root: Path, info: RepoInfo, commit: str) -> Lock:
    """What ``make_lock`` records, read from the build: LFS files by sha256, small files by git blob
    id, and config.json's architectures and model type."""
    files = {
        path: LockedFile(e.size, f"sha256:{e.sha256}" if e.is_lfs else f"gitblob:{e.git_blob_sha1}")
        for path, e in info.files[commit].items()
    }
    config = json.loads(_object(root, info, commit, "config.json"))
    return Lock(info.repo_id, commit, files, tuple(config["architectures"]), config["model_type"])


def test_lock_file_matches_a_fresh_build(
    repos: tuple[Path, RepoInfo, RepoInfo], hub: HubServer, recipe: Recipe
) -> None:
    root, info, _ = repos
    model = recipe.model.model_copy(update={"repo": REPO_ID, "revision": COMMIT, "shards": 96})
    lock = make_lock(model, "recipe", hub.url)
    path = ROOT / LOCK_DIR / f"kimi-deploy--tiny-llama-needle@{COMMIT}.json"
    assert lock.to_json() == path.read_text(encoding="utf-8") == _lock_from_info(root, info, COMMIT).to_json()
    assert len(lock.files) == 104
