"""What a converge names before it repairs it on a host it converged before (kimi_deploy/converge/drift.py),
and what it restarts for it: the example recipe's B300 host, as its probe would find it."""

from __future__ import annotations

import pytest

from kimi_deploy.converge.drift import drift
from kimi_deploy.converge.plan import Converge, needs_start, unit_state
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from tests.host_converge import LOCK, host_converge, lock_stands_in, probe_answer

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
def todo(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch) -> Converge:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    return host_converge(recipe, prod, "b300-01")


def _restarts(todo: Converge, found: HostState) -> set[str]:
    return {u.name for u in todo.units if needs_start(u.release, unit_state(u, found))}


def test_a_host_as_the_deploy_left_it_has_nothing_to_repair(todo: Converge) -> None:
    found = probe_answer(todo) | {"current": todo.release.dir}
    assert drift(todo, found, todo.files) == []
    assert _restarts(todo, found) == set()
    # a new host: everything is new, nothing is drift
    assert drift(todo, probe_answer(todo, installed=False, running=False), todo.files) == []


def test_each_kind_of_drift_is_named_once(todo: Converge) -> None:
    unit_file = next(f for f in todo.files if f.path.endswith("/kimi-vllm.service"))
    env_file = next(f for f in todo.files if f.path.endswith("/kimi-vllm.env") and not f.secret)
    config = next(f for f in todo.files if f.path.endswith("/kimi-weights-scrub.json"))
    found = probe_answer(todo) | {"current": todo.release.dir}
    found["owners"] = found["owners"] | {unit_file.path: "root:root:600", config.path: "kimi:kimi:644"}
    found["files"] = found["files"] | {env_file.path: "0" * 64}
    model = todo.checkpoints[0].path
    found["weights"] = found["weights"] | {
        model: found["weights"][model] | {"unverified": [SHARD], "unreadable": [SHARD]}
    }
    found["units"] = found["units"] | {"kimi-vllm": found["units"]["kimi-vllm"] | {"files_changed": True}}
    assert drift(todo, found, todo.files) == [
        f"{unit_file.path}: owner and mode root:root:600, not root:root:644: put back",
        f"{env_file.path}: content differs from the release serving: written again",
        f"{config.path}: owner and mode kimi:kimi:644, not root:root:644: put back",
        f"weights: 1 files the engine user kimi cannot read ({SHARD}): checked and given their modes back",
        "kimi-vllm: a file it reads was written after it started: restarted with its files",
    ]
    assert _restarts(todo, found) == {"kimi-vllm"}


def test_a_file_that_differs_because_the_plan_changed_is_no_drift(todo: Converge) -> None:
    env_file = next(f for f in todo.files if f.path.endswith("/kimi-vllm.env") and not f.secret)
    found = probe_answer(todo) | {"current": "/opt/kimi/releases/the-one-before"}
    found["files"] = found["files"] | {env_file.path: "0" * 64}
    assert drift(todo, found, todo.files) == []


def test_a_unit_file_systemd_has_not_loaded_is_named_and_restarts_after_a_reload(todo: Converge) -> None:
    found = probe_answer(todo) | {"current": todo.release.dir}
    vllm = found["units"]["kimi-vllm"] | {"files_changed": True, "needs_reload": True}
    found["units"] = found["units"] | {"kimi-vllm": vllm}
    assert drift(todo, found, todo.files) == [
        "kimi-vllm: systemd has not loaded its unit file since it changed: restarted with its files"
    ]
    assert _restarts(todo, found) == {"kimi-vllm"}


def test_a_secret_of_another_owner_or_mode_is_put_back_and_restarts_nothing(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd reads a secret for the unit at its start: its owner and mode put back change nothing the unit read."""
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    router = host_converge(recipe, prod, "gb300-rt01")
    secret = next(f for f in router.files if f.secret)
    found = probe_answer(router) | {"current": router.release.dir}
    found["owners"] = found["owners"] | {secret.path: "kimi:kimi:644"}
    assert drift(router, found, router.files) == [
        f"{secret.path}: owner and mode kimi:kimi:644, not root:root:600: put back"
    ]
    assert _restarts(router, found) == set()


def test_the_release_records_drift_is_named_while_it_serves_and_not_before(todo: Converge) -> None:
    record, copy = todo.release.files[0], todo.release.files[1]
    assert record.path == f"{todo.release.dir}/release.json"
    assert copy.path == f"{todo.release.dir}/files{todo.files[0].path}"
    found = probe_answer(todo) | {"current": todo.release.dir}
    found["files"] = found["files"] | {record.path: "0" * 64, copy.path: None}
    assert drift(todo, found, todo.release.files) == [
        f"{record.path}: content differs from the release serving: written again",
        f"{copy.path}: absent: written again",
    ]
    # an upgrade: the new release's folder is not there yet, and is written whole
    found["current"] = "/opt/kimi/releases/the-one-before"
    assert drift(todo, found, todo.release.files) == []
