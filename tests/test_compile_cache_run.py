"""Where the converge takes each compile cache step, as ``deploys/kimi.py`` orders them in a run.

The deploy function runs for every host of the example inventory in one pyinfra run that
connects nowhere, every step it takes recorded: a rolling change of gb300-pd, every instance
serving, so that the prefill pool restarts in two batches (p01's and p05's instance first, then
p03's), and nobody holds the compile cache of the rank-0 key yet. The host that compiles packs
after its batch answers and serves the pack from then on; the host of the later batch places it
before its batch changes anything; every host of the key takes those steps in one order.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.context import ctx_host

from kimi_deploy.converge import plan as converge_plan
from kimi_deploy.converge.compile_caches import FromThisRun
from kimi_deploy.inventory import Inventory
from kimi_pyinfra import host_plan
from kimi_pyinfra.operations import compile_cache
from tests.conftest import PROD, ROOT
from tests.host_converge import LOCK, probe_answer
from tests.recorded_run import Steps, recorded_run

COMPILES, RECEIVES, BESIDE = "gb300-p01", "gb300-p03", "gb300-p05"


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The controller a converge of the example runs from: its keys at hand, a lock standing in
    for the example's revision, and manifests held in a folder of the test's."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["pyinfra", PROD, "deploys/kimi.py"])
    monkeypatch.setattr(converge_plan, "read_secret", lambda ref, recipe_file, field, environ: "sk-kimi-test")
    monkeypatch.setenv("HF_TOKEN", "hf_kimiCompileCacheRunToken0123")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "controller"))
    monkeypatch.setattr(converge_plan, "read_lock", lambda checkpoint: SimpleNamespace(compact=lambda: LOCK))
    monkeypatch.setattr(converge_plan, "with_committed", lambda recipe, topology, releases: releases)
    monkeypatch.setattr(host_plan, "refusals", lambda recipe, recipe_file, topologies: {})


def _recorded(answer: Any) -> Steps:
    """Every step the deploy takes on each host, by host (``answer(todo)``: each host's probe)."""
    return recorded_run(PROD, answer)[0]


def _rolling(todo: Any) -> Any:
    """A host serving the release before: every engine restarts."""
    answer = probe_answer(todo)
    for name, unit in answer["units"].items():
        if name.startswith("kimi-vllm"):
            answer["units"][name] = unit | {"applied": "an earlier release"}
    return answer


def _names(taken: list[tuple[Any, dict[str, Any]]]) -> list[str]:
    return [arguments["name"] for _, arguments in taken]


def _of(taken: list[tuple[Any, dict[str, Any]]], name: str) -> dict[str, Any]:
    (arguments,) = [a for _, a in taken if a["name"] == name]
    return arguments


def test_the_later_batch_places_what_the_first_packed_before_it_starts(controller: None, prod: Inventory) -> None:
    steps = _recorded(_rolling)
    compiles, receives, beside = steps[COMPILES], steps[RECEIVES], steps[BESIDE]
    names = _names(compiles)
    # the host that compiles: packed once its batch answers, then served for the rest of the run
    packed = _of(compiles, "Compile cache packed")
    assert packed["request"] is not None
    assert packed["request"]["source"].endswith("/torch_compile_cache")
    assert names.index("Router sends to them") < names.index("Compile cache packed")
    assert names.index("Compile cache packed") < names.index("Compile cache served to peers of later batches")
    served = _of(compiles, "Compile cache served to peers of later batches")
    assert served["allow"] == [prod.host(RECEIVES).address]
    assert served["bind"] == prod.host(COMPILES).address
    assert served["path"] == packed["request"]["dir"]
    assert served["port"] == 8479
    assert _of(compiles, "Compile cache packed (second batch)")["request"] is None
    stop = names.index("Compile cache no longer served to peers of later batches")
    assert stop > names.index("Smoke test (last batch)")
    # the host of the later batch: placed from that pack before its batch changes anything
    later = _names(receives)
    place = _of(receives, "Compile cache placed from this run's pack (second batch)")
    assert isinstance(place["receives"], FromThisRun)
    assert place["receives"].source == COMPILES
    assert place["receives"].request["dir"] == packed["request"]["dir"]
    assert later.index("Compile cache placed from this run's pack (second batch)") < later.index(
        "Drained from the router (second batch)"
    )
    assert later.index("Compile cache placed from this run's pack (second batch)") < later.index(
        "Services: leaders (second batch)"
    )
    # nothing comes before the first batch: no such step there
    assert "Compile cache placed from this run's pack" not in later
    assert _of(receives, "Compile cache packed")["request"] is None
    # both take every one of these steps, in one order: pyinfra runs each as a barrier across them
    cache_steps = [n for n in names if n.startswith("Compile cache") and "no longer" not in n]
    assert cache_steps == [n for n in later if n.startswith("Compile cache")]
    assert cache_steps.index("Compile cache served to peers of later batches") < cache_steps.index(
        "Compile cache placed from this run's pack (second batch)"
    )
    # the run's transfer key where the pack crosses the network, and only there
    assert "Weights transfer key" in names
    assert "Weights transfer key" in later
    # the host of the first batch beside the one that compiles compiles too, and takes no such step
    assert not [n for n in _names(beside) if n.startswith("Compile cache") and "placed" not in n]
    assert "Weights transfer key" not in _names(beside)


def test_a_converged_fleet_takes_no_compile_cache_step(controller: None) -> None:
    steps = _recorded(probe_answer)
    ops = {compile_cache.placed, compile_cache.placed_from_run, compile_cache.packed, compile_cache.served_packed}
    for name, taken in steps.items():
        for op, arguments in taken:
            if op in ops:
                body = {k: v for k, v in arguments.items() if k != "name" and not k.startswith("_")}
                with ctx_host.use(SimpleNamespace(name=name, noop=lambda text: None)):
                    assert list(op._inner(**body)) == [], (name, arguments["name"])
