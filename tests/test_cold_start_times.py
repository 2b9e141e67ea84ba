"""The cold start timed on the controller (kimi_pyinfra.cold_start): pyinfra's callbacks, as a run
makes them, become each host's seconds by phase, kept for the run and printed once at its end."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from kimi_deploy.converge.cold_start import HostColdStart
from kimi_pyinfra.cold_start import ColdStartTimes


@dataclass(eq=False)
class _Host:
    name: str
    executing_op_hash: str | None = None


@dataclass
class _State:
    """What the callbacks read of pyinfra's State: the operations, their names and results."""

    names: dict[str, str]  # op hash -> its name, in the run's order
    changed: dict[tuple[str, str], bool]  # (host, op hash) -> whether it changed the host
    inventory: list[_Host] = field(default_factory=list)
    failed_hosts: set[_Host] = field(default_factory=set)
    is_executing: bool = True

    def get_op_order(self) -> list[str]:
        return list(self.names)

    def get_op_meta(self, op_hash: str) -> Any:
        return SimpleNamespace(names={self.names[op_hash]})

    @property
    def ops(self) -> dict[_Host, dict[str, None]]:
        return {h: {op: None for (name, op) in self.changed if name == h.name} for h in self.inventory}

    def get_op_data_for_host(self, host: _Host, op_hash: str) -> Any:
        changed = self.changed[(host.name, op_hash)]
        meta = SimpleNamespace(is_complete=lambda: True, did_change=lambda: changed)
        return SimpleNamespace(operation_meta=meta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr("kimi_pyinfra.cold_start.time", SimpleNamespace(monotonic=lambda: now[0]))
    return now


def test_each_hosts_steps_add_up_by_phase_and_print_once_at_the_end(
    clock: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    hosts: list[Any] = [_Host("kimi-h1"), _Host("kimi-h2"), _Host("kimi-h3")]
    h1, h2, h3 = hosts
    state = _State(
        {
            "r": "kimi | Releases (engine, host tools)",
            "w": "kimi | Weights at the pinned revision",
            "s": "kimi | Smoke test",
        },
        {
            ("kimi-h1", "r"): True,
            ("kimi-h1", "w"): True,
            ("kimi-h1", "s"): True,
            ("kimi-h2", "r"): True,
            ("kimi-h2", "w"): False,
            ("kimi-h3", "r"): False,
            ("kimi-h3", "w"): False,
            ("kimi-h3", "s"): False,
        },
        hosts,
    )
    figures: dict[str, HostColdStart] = {}
    times = ColdStartTimes(figures)
    s: Any = state
    caplog.set_level(logging.INFO, logger="pyinfra")

    times.operation_start(s, "r")
    clock[0] += 4.0
    times.operation_host_success(s, h3, "r")
    clock[0] += 36.0
    times.operation_host_success(s, h1, "r")
    times.operation_host_success(s, h2, "r")
    times.operation_end(s, "r")
    times.operation_start(s, "w")
    clock[0] += 3.0
    times.operation_host_error(s, h2, "w")
    state.failed_hosts.add(h2)
    clock[0] += 2.0
    times.operation_host_success(s, h1, "w")
    times.operation_host_success(s, h3, "w")
    times.operation_end(s, "w")
    # a reboot's disconnect while its operation runs is not the run's end
    h1.executing_op_hash = "s"
    times.host_disconnect(s, h1)
    assert figures == {}
    h1.executing_op_hash = None
    times.operation_start(s, "s")
    clock[0] += 1.0
    times.operation_host_success(s, h1, "s")
    times.operation_host_success(s, h3, "s")
    times.operation_end(s, "s")
    # pyinfra's disconnects after the run print nothing more
    times.host_disconnect(s, h1)

    # kimi-h3 changed nothing: no row of its own
    assert figures == {
        "kimi-h1": HostColdStart("kimi-h1", {"release install": 40.0, "weights": 5.0, "smoke": 1.0}, "serving"),
        "kimi-h2": HostColdStart("kimi-h2", {"release install": 40.0, "weights": 3.0}, "failed", "weights"),
    }
    said = [r.getMessage() for r in caplog.records]
    assert [line for line in said if line.startswith("--> Cold start")] == [
        "--> Cold start: kimi-h1 slowest, 46 s to serving (release install 40 s); 1 failed: kimi-h2 (in weights)"
    ]
    assert said[-1].split()[-3:] == ["failed", "in", "weights"]


def test_a_run_that_ends_before_its_last_step_shows_what_it_timed_at_the_disconnect(clock: list[float]) -> None:
    h1: Any = _Host("kimi-h1")
    state = _State(
        {"r": "kimi | Releases (engine, host tools)", "s": "kimi | Smoke test"}, {("kimi-h1", "r"): True}, [h1]
    )
    figures: dict[str, HostColdStart] = {}
    times = ColdStartTimes(figures)
    s: Any = state
    times.operation_start(s, "r")
    clock[0] += 7.0
    times.operation_host_success(s, h1, "r")
    times.operation_end(s, "r")
    times.host_disconnect(s, h1)
    assert figures == {"kimi-h1": HostColdStart("kimi-h1", {"release install": 7.0}, "stopped")}


def test_a_run_in_which_no_host_changed_prints_nothing(clock: list[float], caplog: pytest.LogCaptureFixture) -> None:
    h1: Any = _Host("kimi-h1")
    state = _State({"p": "kimi | Preflight"}, {("kimi-h1", "p"): False}, [h1])
    figures: dict[str, HostColdStart] = {}
    times = ColdStartTimes(figures)
    s: Any = state
    caplog.set_level(logging.INFO, logger="pyinfra")
    times.operation_start(s, "p")
    times.operation_host_success(s, h1, "p")
    times.operation_end(s, "p")
    assert figures == {}
    assert not [r for r in caplog.records if "Cold start" in r.getMessage()]
