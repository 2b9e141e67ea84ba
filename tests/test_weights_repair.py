"""Weights the engines cannot use: a file they cannot read is found by the host's probe and given
its mode back by the sync (nothing hashed again), and an engine whose weights a converge repairs
restarts on the repaired files, while the units that read no weights stay."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from kimi_deploy.converge.plan import needs_start, unit_state
from kimi_deploy.hostside import revision_files, state_probe, weights_sync
from kimi_deploy.hostside.probe_types import WeightsFound
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from tests.host_converge import host_converge, lock_stands_in, probe_answer

SHARD = "model-00001-of-00002.safetensors"


def _revision(root: Path) -> dict[str, list[object]]:
    """Two files, verified by a sync: their lock."""
    lock: dict[str, list[object]] = {}
    for name, data in ((SHARD, b"weights" * 100), ("config.json", b"{}")):
        (root / name).write_bytes(data)
        lock[name] = [len(data), f"sha256:{hashlib.sha256(data).hexdigest()}"]
    cache: dict[str, list[object]] = {}
    assert weights_sync._verify(str(root), lock, cache, 2) == []
    (root / ".kimi").mkdir()
    (root / ".kimi" / "verify-cache.json").write_text(json.dumps(cache), encoding="utf-8")
    return lock


def test_a_file_the_engines_cannot_read_is_unverified_and_gets_its_mode_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as on a host: the revision's folder in the model's, both open to every user
    tmp_path = tmp_path / "model" / "revision"
    tmp_path.mkdir(parents=True)
    lock = _revision(tmp_path)
    assert state_probe._weights({"dir": str(tmp_path), "lock": lock})["unverified"] == []
    (tmp_path / SHARD).chmod(0o600)
    found = state_probe._weights({"dir": str(tmp_path), "lock": lock})
    assert (found["missing"], found["unverified"], found["unreadable"]) == ([], [SHARD], [SHARD])
    cache = revision_files.load_cache(str(tmp_path))

    def no_hashing(*args: object) -> str:
        raise AssertionError("a file the cache vouches for is not hashed again")

    monkeypatch.setattr(weights_sync, "_hash", no_hashing)
    assert weights_sync._verify(str(tmp_path), lock, cache, 2) == []
    assert (tmp_path / SHARD).stat().st_mode & 0o777 == 0o644
    assert state_probe._weights({"dir": str(tmp_path), "lock": lock})["unverified"] == []


def test_a_folder_the_engines_cannot_enter_makes_its_files_unreadable_until_the_sync_opens_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "model" / "revision"
    (root / "sub").mkdir(parents=True)
    lock = _revision(root)
    (root / "sub" / "tokenizer.json").write_bytes(b"{}")
    lock["sub/tokenizer.json"] = [2, f"sha256:{hashlib.sha256(b'{}').hexdigest()}"]
    spec = {"dir": str(root), "lock": lock}
    cache = revision_files.load_cache(str(root))
    assert weights_sync._verify(str(root), lock, cache, 2) == []
    (root / ".kimi" / "verify-cache.json").write_text(json.dumps(cache), encoding="utf-8")
    assert state_probe._weights(spec)["unreadable"] == []
    (root / "sub").chmod(0o700)
    found = state_probe._weights(spec)
    assert (found["unreadable"], found["unverified"]) == (["sub/tokenizer.json"], ["sub/tokenizer.json"])
    # the model's folder above the revision closes every file
    (root / "sub").chmod(0o755)
    (tmp_path / "model").chmod(0o750)
    assert state_probe._weights(spec)["unreadable"] == sorted(lock)
    (root / "sub").chmod(0o711)
    weights_sync._open_folders(str(root), lock)
    assert [(tmp_path / "model").stat().st_mode & 0o777, (root / "sub").stat().st_mode & 0o777] == [0o755, 0o755]
    assert state_probe._weights(spec)["unreadable"] == []


def test_a_corrupted_file_keeps_its_mode_and_is_named(tmp_path: Path) -> None:
    lock = _revision(tmp_path)
    (tmp_path / SHARD).chmod(0o600)
    os.truncate(tmp_path / SHARD, 10)
    assert weights_sync._verify(str(tmp_path), lock, {}, 2) == [SHARD]
    assert (tmp_path / SHARD).stat().st_mode & 0o777 == 0o600


def test_an_engine_restarts_when_its_weights_are_repaired_and_nothing_else_does(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a lock of two files stands in for the example recipe's
    lock_stands_in(monkeypatch, {SHARD: [10, "sha256:" + "0" * 64], "config.json": [2, "sha256:" + "1" * 64]})
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    for name in ("b300-01", "gb300-rt01"):
        todo = host_converge(recipe, prod, name)
        weights_cases: tuple[tuple[WeightsFound, bool], ...] = (
            ({"exists": True, "missing": [], "unverified": [], "unreadable": [], "extra": ["stray.bin"]}, False),
            ({"exists": True, "missing": [SHARD], "unverified": [], "unreadable": [], "extra": []}, True),
            ({"exists": True, "missing": [], "unverified": [SHARD], "unreadable": [], "extra": []}, True),
        )
        for weights, engines_restart in weights_cases:
            state = probe_answer(todo) | {"weights": {c.path: weights for c in todo.checkpoints}}
            restarts = {u.name for u in todo.units if needs_start(u.release, unit_state(u, state))}
            engines = {u.name for u in todo.units if u.reads_weights}
            assert restarts == (engines if engines_restart else set()), (name, weights)
        assert bool(engines) == (name == "b300-01")
        # the engine's smoke test drops the verification cache of the revision it serves if the
        # engine exits before it is ready (hostside/smoke.py)
        for unit in todo.units:
            if unit.reads_weights:
                assert unit.smoke is not None
                assert unit.smoke.request["verify_cache"] == f"{todo.weights.path}/.kimi/verify-cache.json"  # type: ignore[union-attr]
