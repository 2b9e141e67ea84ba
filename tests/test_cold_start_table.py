"""The cold-start table a converge ends with: each host's phases, slowest host first and named,
a failed host shown as failed, a large fleet folded to its slowest hosts and a median/max row."""

from __future__ import annotations

import re

import pytest

from kimi_deploy.converge.cold_start import (
    FOLD_AT,
    FOLDED,
    PHASES,
    HostColdStart,
    Phase,
    cold_start_lines,
    phase_of,
)


def _host(name: str, outcome: str = "serving", failed_in: Phase | None = None, **took: float) -> HostColdStart:
    phases = {p: took[p.replace(" ", "_")] for p in PHASES if p.replace(" ", "_") in took}
    return HostColdStart(name, phases, outcome, failed_in)  # type: ignore[arg-type]


def _rows(lines: list[str]) -> list[list[str]]:
    """The table's rows (header first), cells split where two spaces or more part them."""
    return [re.split(r"\s{2,}", line.strip()) for line in lines[1:]]


@pytest.mark.parametrize(
    ("step", "phase"),
    [
        ("kimi | drivers | NVIDIA driver pin", "drivers"),
        ("kimi | drivers | Reboot into the NVIDIA driver", "drivers"),
        ("kimi | drivers | Drivers: checks", "drivers"),
        ("kimi | Releases (engine, host tools)", "release install"),
        ("kimi | Weights at the pinned revision", "weights"),
        ("kimi | Weights transfer key", "weights"),
        ("kimi | Weights served to peers", "weights"),
        ("kimi | Weights no longer served to peers", "weights"),
        ("kimi | Compile cache served to peers", "compile cache"),
        ("kimi | Compile cache placed", "compile cache"),
        ("kimi | Compile cache no longer served to peers", "compile cache"),
        ("kimi | Compile cache packed", "compile cache"),
        ("kimi | Communication check: listeners", "communication check"),
        ("kimi | Communication check", "communication check"),
        ("kimi | All-reduce check", "communication check"),
        ("kimi | Rendered units and configs (first batch)", "units and start"),
        ("kimi | Current release", "units and start"),
        ("kimi | Services: engines (second batch)", "units and start"),
        ("kimi | Smoke test", "smoke"),
        ("kimi | Smoke test of units still starting", "smoke"),
        ("kimi | Preflight", "other"),
        ("kimi | Debian packages", "other"),
        ("kimi | Release recorded serving", "other"),
        ("kimi | Old revisions collected", "other"),
    ],
)
def test_each_step_of_the_deploy_falls_in_its_phase(step: str, phase: Phase) -> None:
    assert phase_of(step) == phase


def test_the_slowest_host_and_its_slowest_phase_are_named_first() -> None:
    hosts = [
        _host("kimi-h1", release_install=12.0, weights=20.0, smoke=3.0),
        _host("kimi-h2", release_install=41.0, weights=25.0, units_and_start=2.0, smoke=6.0),
        _host("kimi-h3", release_install=10.0, weights=8.0),
    ]
    lines = cold_start_lines(hosts)
    assert lines[0] == "--> Cold start: kimi-h2 slowest, 74 s to serving (release install 41 s)"
    header, *rows = _rows(lines)
    assert header == ["host", *PHASES, "to serving"]
    assert [r[0] for r in rows] == ["kimi-h2", "kimi-h1", "kimi-h3"]
    assert rows[0] == ["kimi-h2", "-", "41", "25", "-", "-", "2.0", "6.0", "-", "74"]
    assert rows[2][-1] == "18"


def test_a_failed_host_is_shown_failed_in_its_phase_and_named() -> None:
    hosts = [
        _host("kimi-h1", release_install=5.0, weights=4.0),
        _host("kimi-h3", "failed", "release install", release_install=90.0),
    ]
    lines = cold_start_lines(hosts)
    # the slowest host is one that got to serving: the failed one never did
    assert lines[0] == (
        "--> Cold start: kimi-h1 slowest, 9.0 s to serving (release install 5.0 s); "
        "1 failed: kimi-h3 (in release install)"
    )
    rows = _rows(lines)[1:]
    assert [r[0] for r in rows] == ["kimi-h1", "kimi-h3"]
    assert rows[1][-1] == "failed in release install"
    assert rows[1][2] == "90"


def test_no_host_serving_says_so() -> None:
    lines = cold_start_lines([_host("kimi-h1", "failed", "weights", weights=3.0)])
    assert lines[0] == "--> Cold start: no host got to serving; 1 failed: kimi-h1 (in weights)"


def test_a_run_that_stopped_claims_no_serving() -> None:
    lines = cold_start_lines([_host("kimi-h1", "stopped", weights=30.0, release_install=4.0)])
    assert lines[0] == "--> Cold start: the run stopped before serving; kimi-h1 slowest so far, 34 s (weights 30 s)"
    assert _rows(lines)[1][-1] == "stopped (34)"


def test_no_host_that_took_a_step_prints_nothing() -> None:
    assert cold_start_lines([]) == []


def test_up_to_the_fold_every_host_has_a_row() -> None:
    hosts = [_host(f"kimi-h{i}", weights=float(i)) for i in range(1, FOLD_AT + 1)]
    assert len(_rows(cold_start_lines(hosts))) == 1 + FOLD_AT


def test_a_large_fleet_shows_its_slowest_hosts_and_a_median_max_row() -> None:
    # 64 hosts: weights i seconds, release install 10 s each; kimi-h7 failed
    hosts = [_host(f"kimi-h{i}", release_install=10.0, weights=float(i)) for i in range(1, 65) if i != 7]
    hosts.append(_host("kimi-h7", "failed", "weights", release_install=10.0, weights=200.0))
    lines = cold_start_lines(hosts)
    assert lines[0] == (
        "--> Cold start: kimi-h64 slowest, 74 s to serving (weights 64 s); 1 failed: kimi-h7 (in weights)"
    )
    rows = _rows(lines)[1:]
    assert len(rows) == FOLDED + 1
    assert [r[0] for r in rows[:FOLDED]] == ["kimi-h64", "kimi-h63", "kimi-h62", "kimi-h61", "kimi-h60"]
    summary = rows[-1]
    # over the 63 hosts that did not fail: weights 1..64 but 7, median 33, max 64
    assert summary[0] == "median/max of 63"
    assert summary[1 + PHASES.index("weights")] == "33/64"
    assert summary[1 + PHASES.index("release install")] == "10/10"
    assert summary[1 + PHASES.index("drivers")] == "0.0/0.0"
    assert summary[-1] == "43/74"


def test_many_failed_hosts_are_counted_past_those_named() -> None:
    hosts = [_host("kimi-h1", weights=1.0)] + [_host(f"kimi-h{i}", "failed", "smoke", smoke=1.0) for i in range(2, 12)]
    head = cold_start_lines(hosts)[0]
    assert head.endswith("and 2 more")
    assert "10 failed: kimi-h10 (in smoke), kimi-h11 (in smoke)" in head
