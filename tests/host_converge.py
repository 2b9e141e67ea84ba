"""One host's converge of the example recipe and inventory as ``deploys/kimi.py`` plans it
(``kimi_deploy.converge.plan.plan_converge``), without pyinfra."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from kimi_deploy.converge import plan as converge
from kimi_deploy.converge.plan import Converge, plan_converge
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.probe_types import ReleaseMarker, TimerState, UnitState, WeightsFound
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.venvs import VenvRelease
from tests.conftest import RECIPE
from tests.test_preflight import B300, GB300


def host_converge(recipe: Recipe, prod: Inventory, name: str) -> Converge:
    """Host ``name``'s converge (the topology's key read as the recipe says: set it first)."""
    full = plan(recipe, RECIPE, prod)
    spec = full.for_host(name)
    # the tests' environment stands for the controller's (secrets named by variable, the Hub token)
    return plan_converge(DeployPlan(recipe, RECIPE, spec, prod.host(name), full.topology(spec.topology)), os.environ)


def lock_stands_in(monkeypatch: pytest.MonkeyPatch, compact: dict[str, list[Any]]) -> None:
    """The example recipe's revision has no lock file: ``compact`` (file -> [size, digest]) is its lock."""
    monkeypatch.setattr(converge, "read_lock", lambda recipe: SimpleNamespace(compact=lambda: compact))


# A lock of two files, for a converge of the example recipe (``lock_stands_in``).
LOCK: dict[str, list[Any]] = {
    "model-00001-of-00002.safetensors": [10, "sha256:" + "0" * 64],
    "config.json": [2, "sha256:" + "1" * 64],
}


def probe_answer(
    todo: Converge, *, installed: bool = True, running: bool = True, revisions: list[str] | None = None
) -> HostState:
    """``KimiHostState``'s answer, in ``hostside/state_probe.py``'s shape (every path, unit and timer it is
    asked about is in it), on a host where ``todo``'s releases are installed, its weights verified
    and its units running as planned (``running``), or on a new host (neither)."""
    files = todo.files + todo.release.files + ([todo.weights.token] if todo.weights and todo.weights.token else [])
    hardware = GB300 if any(u.reads_weights for u in todo.units) else B300
    weights: WeightsFound = {
        "exists": installed,
        "missing": [] if installed else list(LOCK),
        "unverified": [],
        "unreadable": [],
        "extra": [],
    }

    def present(checkpoint: Any) -> list[str]:
        """The revision folders of a checkpoint's folder: ``revisions`` for the model's."""
        if revisions is not None and checkpoint.link == "model":
            return revisions
        return [checkpoint.revision] if installed else []

    def marker(v: VenvRelease) -> ReleaseMarker | None:
        return (
            {"requirements": v.requirements, "without": v.without, "lock": {"sha256": "a" * 64}} if installed else None
        )

    def unit(release: str) -> UnitState:
        if not running:
            return {
                "active": "inactive",
                "sub": "dead",
                "since": None,
                "pid": 0,
                "enabled": "",
                "applied": None,
                "secrets_changed": False,
                "files_changed": False,
                "needs_reload": False,
                "restarts": 0,
                "restarts_verified": 0,
                "verified": False,
                "down_s": None,
                "context": None,
            }
        return {
            "active": "active",
            "sub": "running",
            "since": 1_780_000_000.0,
            "pid": 4100,
            "enabled": "enabled",
            "applied": release,
            "secrets_changed": False,
            "files_changed": False,
            "needs_reload": False,
            "restarts": 0,
            "restarts_verified": 0,
            "verified": True,
            "down_s": None,
            "context": None,
        }

    timer: TimerState = {"active": "active", "enabled": "enabled"} if running else {"active": "inactive", "enabled": ""}
    return {
        "user": installed,
        "venvs": {v.path: marker(v) for v in todo.venvs},
        "weights": {c.path: weights for c in todo.checkpoints},
        "files": {f.path: f.sha256 if running else None for f in files},
        "owners": {f.path: f.owner_mode(todo.user) if running else None for f in files},
        "units": {u.name: unit(u.release) for u in todo.units},
        "timers": dict.fromkeys(todo.timers, timer),
        "revisions": {
            c.path.rsplit("/", 1)[0]: {"present": present(c), "history": present(c)} for c in todo.checkpoints
        },
        "listeners": {},
        "packages": dict.fromkeys(todo.packages, installed),
        "platform": {"python": "3.11", "machine": "x86_64", "libc": "glibc 2.36"},
        "router_drained": [],
        "current": todo.release.dir if running else None,
        "last_release": None,
        "releases": None,
        "ladder": [],
        "watchdog": None,
        "hardware": hardware,
        "drivers": None,
    }
