"""The watchdog on the demo cluster's hosts, between converges: an engine killed, an engine that
answers garbage, a GPU that falls off the bus, each met on the host without a converge; the next
converge tells what the watchdog did; Debian's Prometheus, scraping Debian's node exporter on the
host, holds the events as series.

Faults go in through the cluster's knobs: the stand-in engine's (``/etc/kimi-standin-faults.json``)
and the fake GPUs' (``/etc/kimi-fake-accelerators.json``), read by the same nvidia-smi calls a
real host answers.
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
LADDER = {"interval_s": 1, "timeout_s": 2, "restart_after": 2, "restarts": 1, "grace_s": 30}
FAKE_GPUS = "/etc/kimi-fake-accelerators.json"
KNOB = "/etc/kimi-standin-faults.json"
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
        ssh(host, f"rm -f {KNOB} {TEXTFILE}/kimi_watchdog.prom")


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


def _gpus(host: str, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(ssh(host, f"cat {FAKE_GPUS}"))
    edit(data)
    ssh(host, f"cat > {FAKE_GPUS}", stdin=json.dumps(data).encode())


def _serves(host: str) -> bool:
    try:
        return bool(chat(f"http://{address(host)}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY")
    except OSError:
        return False


def test_a_killed_engine_is_restarted_by_systemd_and_the_watchdog_sees_it_back(watched: Path) -> None:
    before = main_pid("kimi-h1", "kimi-vllm")
    ssh("kimi-h1", f"kill -9 {before}")
    _until(lambda: main_pid("kimi-h1", "kimi-vllm") not in (0, before), "systemd starts the engine again")
    _until(lambda: _unit_state("kimi-h1") == "serving" and _serves("kimi-h1"), "the engine serves again")
    said = _journal("kimi-h1")
    assert any(line.startswith("kimi-vllm: systemd restarted it (NRestarts ") for line in said), said[-10:]
    # systemd's own restart: the watchdog made none
    assert _state("kimi-h1")["counts"]["kimi-vllm"].get("restart", 0) == 0


def test_an_engine_answering_garbage_is_restarted_then_drained_while_the_other_serves(watched: Path) -> None:
    ssh("kimi-h2", f"echo '{{\"answer\": \"#@!kjh\"}}' > {KNOB}")
    _until(lambda: _unit_state("kimi-h2") == "drained", "the watchdog drains kimi-h2's engine")
    said = _journal("kimi-h2")
    wrong = "canary: answered '#@!kjh', not 'READY'"
    assert f"kimi-vllm: {wrong} (2 checks in a row): restarting (1 of 1)" in said, said[-10:]
    assert f"kimi-vllm: {wrong} after 1 restarts: draining (stopped; the router's health checks take it out)" in said
    assert ssh("kimi-h2", "systemctl is-active kimi-vllm || true") == "inactive"
    assert _serves("kimi-h1")
    # the knob removed, the next converge tells what happened and starts the engine again
    ssh("kimi-h2", f"rm -f {KNOB}")
    run = pyinfra("--data", f"kimi_recipe={watched}")
    assert run.code == 0, run.log[-3000:]
    told = [line.split("watchdog: ", 1)[1] for line in run.log.splitlines() if "[kimi-h2] watchdog: " in line]
    assert len(told) == 3, told
    assert told[0].startswith("kimi-vllm drained since ")
    assert told[0].endswith(f': "{wrong}"')
    assert told[1].startswith("kimi-vllm restarted at ")
    assert told[2].startswith("kimi-vllm drained at ")
    assert run.changed()["Services: leaders (second batch)"] == ["kimi-h2"]
    _until(lambda: _unit_state("kimi-h2") == "serving", "the watchdog sees kimi-h2 serving again")
    assert _serves("kimi-h2")


@pytest.fixture
def prometheus(watched: Path, tmp_path: Path) -> Iterator[Prometheus]:
    """Debian's node exporter installed on kimi-h1 from the cluster's Debian mirror, as an operator
    would (its textfile collector reads the folder the watchdog writes in), and Debian's
    Prometheus on this machine scraping it."""
    ssh("kimi-h1", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                   "prometheus-node-exporter > /dev/null")  # fmt: skip
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
    def lose(data: dict[str, Any]) -> None:
        data["gpus"][5]["lost"] = True

    def find(data: dict[str, Any]) -> None:
        data["gpus"][5].pop("lost", None)

    _gpus("kimi-h1", lose)
    try:
        _until(lambda: _unit_state("kimi-h1") == "drained", "the watchdog drains kimi-h1's engine")
        state = _state("kimi-h1")
        assert state["host"]["accelerators"]["count"] == 7
        assert state["units"]["kimi-vllm"]["why"].startswith(
            "accelerators: 7 of 8 GPUs answer nvidia-smi (Unable to determine the device handle for GPU0000:"
        )
        assert _serves("kimi-h2")
        metrics = ssh("kimi-h1", f"cat {TEXTFILE}/kimi_watchdog.prom").splitlines()
        assert 'kimi_watchdog_accelerators{state="present"} 7' in metrics
        assert 'kimi_watchdog_state{unit="kimi-vllm",state="drained"} 1' in metrics
        assert 'kimi_watchdog_actions_total{unit="kimi-vllm",action="stop"} 1' in metrics
        # the same, as Prometheus scraped it from the node exporter
        stops = 'kimi_watchdog_actions_total{job="node",unit="kimi-vllm",action="stop"}'
        _until(lambda: _value(prometheus, stops) == 1, "Prometheus holds the drain")
        assert _value(prometheus, 'min_over_time(kimi_watchdog_accelerators{state="present"}[10m])') == 7
        assert _value(prometheus, 'max_over_time(kimi_watchdog_state{unit="kimi-vllm",state="drained"}[10m])') == 1
    finally:
        _gpus("kimi-h1", find)
    run = pyinfra("--data", f"kimi_recipe={watched}")
    assert run.code == 0, run.log[-3000:]
    _until(lambda: _unit_state("kimi-h1") == "serving", "kimi-h1 serving again")
    assert 'kimi_watchdog_up{unit="kimi-vllm"} 1' in ssh("kimi-h1", f"cat {TEXTFILE}/kimi_watchdog.prom").splitlines()
