"""The watchdog on the demo cluster's hosts, between converges: an engine killed, an engine that
answers garbage, a GPU that falls off the bus, a shard corrupted on disk, each met on the host
(and, for a GPU fault, the driver's Xid in the kernel's log) without a converge; the next
converge tells what the watchdog did; Debian's Prometheus, scraping
Debian's node exporter on the host, holds the events as series.

The faults are ``deploys/drill.py``'s: the safe ones it injects itself, the others through the
cluster's knobs (``localcluster.fault_knobs``, which the demo inventory hands on): the stand-in
engine's garbage and the fake GPUs' loss, read by the same nvidia-smi calls a real host answers.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.demo import address, chat, demo_recipe, main_pid, pyinfra, ssh
from tests.prometheus_server import Prometheus

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

# Quick rounds, so that each drill takes seconds: 2 failed checks restart, one restart then drain.
LADDER = {
    "interval_s": 1,
    "timeout_s": 2,
    "canary_interval_s": 1,
    "canary_timeout_s": 5,
    "restart_after": 2,
    "restarts": 1,
    "grace_s": 30,
}
TEXTFILE = "/var/lib/prometheus/node-exporter"
PROMPT = "Reply with exactly the word READY and nothing else."


def _quick(data: dict[str, Any]) -> None:
    data["watchdog"] = LADDER


@pytest.fixture(scope="module")
def watched(demo_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The demo cluster converged with the quick ladder."""
    recipe = demo_recipe(tmp_path_factory.mktemp("watchdog") / "recipe.yaml", _quick)
    run = pyinfra("--data", f"kimi_recipe={recipe}")
    assert run.code == 0, run.log[-3000:]
    yield recipe
    for host in ("kimi-h1", "kimi-h2"):
        _drill(recipe, "clear", host)


def _state(host: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(ssh(host, "cat /var/lib/kimi/watchdog.json"))
    return found


def _until(what: Callable[[], Any], why: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:g} s: {why}")


def _unit_state(host: str, unit: str = "kimi-vllm") -> str:
    return str(_state(host)["units"][unit]["state"])


def _journal(host: str) -> list[str]:
    return ssh(host, "journalctl -u kimi-watchdog -o cat --no-pager -n 200").splitlines()


def _drill(recipe: Path, drill: str, host: str) -> None:
    run = pyinfra(
        "--data", f"kimi_recipe={recipe}", "--data", f"kimi_drill={drill}", "--limit", host, deploy="deploys/drill.py"
    )
    assert run.code == 0, run.log[-3000:]
    assert f"drill: {drill} {'done' if drill == 'clear' else 'injected'} at " in run.log, run.log[-3000:]


def _serves(host: str) -> bool:
    try:
        return bool(chat(f"http://{address(host)}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY")
    except OSError:
        return False


def test_a_killed_engine_is_restarted_by_systemd_and_the_watchdog_sees_it_back(watched: Path) -> None:
    before = main_pid("kimi-h1", "kimi-vllm")
    _drill(watched, "engine-killed", "kimi-h1")
    _until(lambda: main_pid("kimi-h1", "kimi-vllm") not in (0, before), "systemd starts the engine again")
    _until(lambda: _unit_state("kimi-h1") == "serving" and _serves("kimi-h1"), "the engine serves again")
    said = _journal("kimi-h1")
    assert any(line.startswith("kimi-vllm: systemd restarted it (NRestarts ") for line in said), said[-10:]
    # systemd's own restart: the watchdog made none
    assert _state("kimi-h1")["counts"]["kimi-vllm"].get("restart", 0) == 0


def test_an_engine_answering_garbage_is_drained_at_once_while_the_other_serves(watched: Path) -> None:
    _drill(watched, "engine-garbage", "kimi-h2")
    _until(lambda: _unit_state("kimi-h2") == "drained", "the watchdog drains kimi-h2's engine")
    said = _journal("kimi-h2")
    wrong = "canary: wrong answer: '#@!kjh garbage', not 'READY'"
    drained = f"kimi-vllm: {wrong} (2 checks in a row): draining (stopped; the router's health checks take it out)"
    assert drained in said, said[-10:]
    # not restarted first: it would have rejoined the router on its /health, still answering wrong
    assert not [line for line in said if "restarting" in line], said[-10:]
    assert ssh("kimi-h2", "systemctl is-active kimi-vllm || true") == "inactive"
    assert _serves("kimi-h1")
    # the knob cleared (which starts the engine again too), the next converge tells what happened
    _drill(watched, "clear", "kimi-h2")
    _until(lambda: _unit_state("kimi-h2") == "serving", "the watchdog sees kimi-h2 serving again")
    run = pyinfra("--data", f"kimi_recipe={watched}")
    assert run.code == 0, run.log[-3000:]
    told = [line.split("watchdog: ", 1)[1] for line in run.log.splitlines() if "[kimi-h2] watchdog: " in line]
    assert len(told) == 1, told
    assert told[0].startswith("kimi-vllm drained at ")
    assert told[0].endswith(f': "{wrong}"')
    assert _serves("kimi-h2")


@pytest.fixture
def prometheus(watched: Path, tmp_path: Path) -> Iterator[Prometheus]:
    """Debian's node exporter installed on kimi-h1 from the cluster's Debian mirror, as an operator
    would (its textfile collector reads the folder the watchdog writes in), and Debian's
    Prometheus on this machine scraping it."""
    ssh(
        "kimi-h1",
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        "prometheus-node-exporter > /dev/null",
    )
    server = Prometheus(tmp_path / "prometheus", [f"{address('kimi-h1')}:9100"])
    try:
        _until(lambda: server.query('up{job="node"} == 1'), "Prometheus scrapes kimi-h1's node exporter")
        yield server
    finally:
        server.close()


def _value(server: Prometheus, promql: str) -> float | None:
    found = server.query(promql)
    return float(found[0]["value"][1]) if found else None


def test_a_gpu_lost_drains_the_engine_of_its_host_and_prometheus_has_the_events(
    watched: Path, prometheus: Prometheus
) -> None:
    _drill(watched, "accelerator-lost", "kimi-h1")
    try:
        _until(lambda: _unit_state("kimi-h1") == "drained", "the watchdog drains kimi-h1's engine")
        state = _state("kimi-h1")
        assert state["host"]["accelerators"]["count"] == 7
        assert state["units"]["kimi-vllm"]["why"].startswith(
            "accelerators: 7 of 8 GPUs answer nvidia-smi (Unable to determine the device handle for GPU0000:"
        )
        assert _serves("kimi-h2")
        # the driver's Xid 79 for it, in the host's kernel log
        assert any(line.startswith("host: Xid 79 on GPU ") for line in _journal("kimi-h1"))
        metrics = ssh("kimi-h1", f"cat {TEXTFILE}/kimi_watchdog.prom").splitlines()
        assert "kimi_watchdog_accelerators_present 7" in metrics
        assert any(line.startswith('kimi_watchdog_xid_events_total{xid="79"} ') for line in metrics), metrics
        assert 'kimi_watchdog_state{unit="kimi-vllm",state="drained"} 1' in metrics
        assert 'kimi_watchdog_actions_total{unit="kimi-vllm",action="stop"} 1' in metrics
        # the same, as Prometheus scraped it from the node exporter
        stops = 'kimi_watchdog_actions_total{job="node",unit="kimi-vllm",action="stop"}'
        _until(lambda: _value(prometheus, stops) == 1, "Prometheus holds the drain")
        assert _value(prometheus, "min_over_time(kimi_watchdog_accelerators_present[10m])") == 7
        assert _value(prometheus, 'max_over_time(kimi_watchdog_state{unit="kimi-vllm",state="drained"}[10m])') == 1
    finally:
        _drill(watched, "clear", "kimi-h1")
    run = pyinfra("--data", f"kimi_recipe={watched}")
    assert run.code == 0, run.log[-3000:]
    _until(lambda: _unit_state("kimi-h1") == "serving", "kimi-h1 serving again")
    assert 'kimi_watchdog_up{unit="kimi-vllm"} 1' in ssh("kimi-h1", f"cat {TEXTFILE}/kimi_watchdog.prom").splitlines()


def test_an_xid_drains_the_engine_that_ran_when_it_came_and_a_start_after_it_serves(
    watched: Path, prometheus: Prometheus
) -> None:
    """The driver logs an Xid 119 (GSP timeout) for a GPU that still answers nvidia-smi: the
    kernel's log alone tells; the engine is drained; started again (the drill's clear), it serves."""
    _drill(watched, "accelerator-xid", "kimi-h1")
    try:
        _until(lambda: _unit_state("kimi-h1") == "drained", "the watchdog drains kimi-h1's engine")
        state = _state("kimi-h1")
        assert state["host"]["accelerators"]["count"] == 8
        assert state["host"]["kernel_log"] is None
        why = state["units"]["kimi-vllm"]["why"]
        assert why.startswith("accelerators: Xid 119 on GPU 0000:"), why
        assert "Timeout after 6s of waiting for RPC response from GPU7 GSP!" in why
        assert _serves("kimi-h2")
        series = 'kimi_watchdog_xid_events_total{job="node",xid="119"}'
        _until(lambda: (_value(prometheus, series) or 0) >= 1, "Prometheus holds the Xid")
    finally:
        _drill(watched, "clear", "kimi-h1")
    # started after the Xid: judged afresh, no converge needed
    _until(lambda: _unit_state("kimi-h1") == "serving" and _serves("kimi-h1"), "kimi-h1 serving again")


def test_a_gpu_its_nvlink_fabric_refused_drains_the_engine_and_clear_brings_it_back(watched: Path) -> None:
    """The fabric refuses a GPU (fabric.state Completed, status Insufficient Resources) that still
    answers nvidia-smi: the engine of its host is drained; the fabric whole again and the engine
    started (the drill's clear), it serves."""
    _drill(watched, "fabric-refused", "kimi-h1")
    try:
        _until(lambda: _unit_state("kimi-h1") == "drained", "the watchdog drains kimi-h1's engine")
        state = _state("kimi-h1")
        assert state["host"]["accelerators"]["count"] == 8
        why = state["units"]["kimi-vllm"]["why"]
        assert why.startswith("accelerators: GPU 0000"), why
        assert why.endswith(": fabric Completed, Insufficient Resources"), why
        assert _serves("kimi-h2")
    finally:
        _drill(watched, "clear", "kimi-h1")
    _until(lambda: _unit_state("kimi-h1") == "serving" and _serves("kimi-h1"), "kimi-h1 serving again")


def test_a_shard_corrupted_on_disk_is_repaired_by_the_scrub_and_the_engine_restarts_on_it(watched: Path) -> None:
    before = main_pid("kimi-h2", "kimi-vllm")
    _drill(watched, "shard-corrupted", "kimi-h2")
    restarted = "weights: the scrub re-fetched 1 corrupted files since it started"
    _until(lambda: any(a["why"] == restarted for a in _state("kimi-h2")["actions"]), "the watchdog restarts the engine")
    _until(lambda: _unit_state("kimi-h2") == "serving" and _serves("kimi-h2"), "the engine serves again")
    assert main_pid("kimi-h2", "kimi-vllm") != before
    scrub = ssh("kimi-h2", "journalctl -u kimi-weights-scrub -o cat --no-pager")
    assert "kimi-deploy: scrub: re-fetched 1 corrupted files" in scrub, scrub[-2000:]
    # the next converge: nothing to repair, the restart told
    run = pyinfra("--data", f"kimi_recipe={watched}")
    assert run.code == 0, run.log[-3000:]
    assert "[kimi-h2] watchdog: kimi-vllm restarted at " in run.log
    assert "repairs: " not in run.log
