"""The serving benchmark in the release record and against the release it replaced
(hostside/bench_record.py, kimi_deploy/benchmark/delta.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.benchmark.delta import figures, format_delta
from kimi_deploy.benchmark.types import Report
from kimi_deploy.hostside import bench_record

REPORT: Report = {
    "topology": "demo-vllm",
    "endpoint": "http://10.213.7.11:8000",
    "generator": "kimi-h1",
    "recipe": "recipes/demo.yaml",
    "run": "r2",
    "at": "2026-12-04T15:00:00Z",
    "accelerators": {"kind": "cpu", "count": 2.0},
    "generator_load_cpu_s": 7.7,
    "tasks": ["a"],
    "targets": {
        "local": [
            {
                "concurrency": 1,
                "requests": 5,
                "succeeded": 3,
                "success_rate": 0.6,
                "errors": 0,
                "error_kinds": {},
                "failed_tasks": {"a": {"failed": 2, "first_reason": "expected exactly 'x', found 'y'"}},
                "ttft_p50_s": 0.2,
                "ttft_p95_s": 0.3,
                "itl_p50_ms": 5.0,
                "itl_p95_ms": 6.0,
                "output_tok_s": 120.0,
                "wall_s": 10.0,
                "generator_cpu_s": 1.0,
                "engine_cpu_s": 20.0,
                "kv_cache_usage": 0.1,
                "accelerator_memory_mib": None,
                "unit_memory_mib": 2048.0,
                "tokens_in": 100.0,
                "tokens_out": 200.0,
                "generator_error": None,
                "cost": {
                    "currency": "USD",
                    "compute": 3.0,
                    "storage_network": 0.5,
                    "operations": 0.5,
                    "correction": 0.5,
                    "total": 4.5,
                    "per_success": 1.5,
                },
            },
            {
                "concurrency": 16,
                "requests": 35,
                "succeeded": 35,
                "success_rate": 1.0,
                "errors": 0,
                "error_kinds": {},
                "failed_tasks": {},
                "ttft_p50_s": 0.9,
                "ttft_p95_s": 1.0,
                "itl_p50_ms": 9.0,
                "itl_p95_ms": 12.0,
                "output_tok_s": 400.0,
                "wall_s": 20.0,
                "generator_cpu_s": 2.0,
                "engine_cpu_s": 60.0,
                "kv_cache_usage": 0.4,
                "accelerator_memory_mib": None,
                "unit_memory_mib": 2048.0,
                "tokens_in": 700.0,
                "tokens_out": 1400.0,
                "generator_error": None,
                "cost": None,
            },
        ]
    },
}


def test_a_record_keeps_the_figures_per_target_and_level() -> None:
    kept = figures(REPORT)
    assert kept["run"] == "r2"
    assert kept["targets"]["local"][0] == {
        "concurrency": 1,
        "requests": 5,
        "succeeded": 3,
        "success_rate": 0.6,
        "ttft_p50_s": 0.2,
        "ttft_p95_s": 0.3,
        "itl_p50_ms": 5.0,
        "output_tok_s": 120.0,
        "cost_per_success": 1.5,
    }
    assert kept["targets"]["local"][1]["cost_per_success"] is None


def test_the_difference_is_against_each_level_of_the_earlier_release() -> None:
    then = json.loads(json.dumps(figures(REPORT)))
    then["targets"]["local"][0] |= {
        "ttft_p50_s": 0.1,
        "output_tok_s": 150.0,
        "success_rate": 0.8,
        "cost_per_success": 1.0,
    }
    then["targets"]["local"].pop()  # a level the earlier run did not have
    lines = format_delta(figures(REPORT), {"release": "aaaa", "at": "yesterday", "figures": then}, "bbbb")
    assert lines == [
        "Against release 'aaaa' (benchmarked 'yesterday'), now 'bbbb':",
        "  local at 1: TTFT p50 0.200 s (+100% vs 0.100), output 120.0 tok/s (-20% vs 150.0), success 60% (-20 pt), "
        "cost/success 1.500000 (+50% vs 1.000000)",
    ]


@pytest.mark.parametrize("before", [None, "x", {"figures": "x"}, {"figures": {"targets": ["x"]}}])
def test_an_earlier_record_it_cannot_read_gives_nothing(before: Any) -> None:
    assert format_delta(figures(REPORT), before, "bbbb") == []


def test_an_earlier_figure_it_cannot_read_is_left_out_of_the_line() -> None:
    before = {"release": "aaaa", "figures": {"targets": {"local": ["x", {"concurrency": 1, "ttft_p50_s": "fast"}]}}}
    assert format_delta(figures(REPORT), before, "bbbb")[1:] == [
        "  local at 1: TTFT p50 0.200 s, output 120.0 tok/s, success 60%, cost/success 1.500000"
    ]


def test_the_record_goes_in_the_serving_release_and_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, releases = tmp_path / "state", tmp_path / "releases"
    state.mkdir()
    (releases / "r-old").mkdir(parents=True)
    (releases / "r-new").mkdir()
    current = tmp_path / "current"
    monkeypatch.setattr(bench_record, "STATE_DIR", str(state))
    monkeypatch.setattr(bench_record, "HISTORY", str(state / "bench-history.json"))
    request = {"figures": {"run": "1"}, "current": str(current), "releases": str(releases)}
    current.symlink_to(releases / "r-old")
    assert bench_record.record(request) == {"release": "r-old", "before": None}
    assert bench_record.record({**request, "figures": {"run": "2"}}) == {"release": "r-old", "before": None}
    current.unlink()
    current.symlink_to(releases / "r-new")
    answer = bench_record.record({**request, "figures": {"run": "3"}})
    # the latest run of the release it replaced
    assert answer["release"] == "r-new"
    assert (answer["before"]["release"], answer["before"]["figures"]) == ("r-old", {"run": "2"})
    assert json.loads((releases / "r-new" / "bench.json").read_text())["figures"] == {"run": "3"}
    assert json.loads((releases / "r-old" / "bench.json").read_text())["figures"] == {"run": "2"}
    runs = json.loads((state / "bench-history.json").read_text())["runs"]
    assert [(r["release"], r["figures"]["run"]) for r in runs] == [("r-old", "1"), ("r-old", "2"), ("r-new", "3")]


def test_a_current_link_out_of_the_releases_folder_writes_no_release_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, releases, elsewhere = tmp_path / "state", tmp_path / "releases", tmp_path / "etc"
    for folder in (state, releases, elsewhere):
        folder.mkdir()
    monkeypatch.setattr(bench_record, "STATE_DIR", str(state))
    monkeypatch.setattr(bench_record, "HISTORY", str(state / "bench-history.json"))
    current = tmp_path / "current"
    current.symlink_to(elsewhere)
    answer = bench_record.record({"figures": {}, "current": str(current), "releases": str(releases)})
    assert answer == {"release": None, "before": None}
    assert list(elsewhere.iterdir()) == []
    # ..., nor one through a link inside the folder that leads out of it
    (releases / "sneaky").symlink_to(elsewhere)
    current.unlink()
    current.symlink_to(releases / "sneaky")
    assert bench_record.record({"figures": {}, "current": str(current), "releases": str(releases)})["release"] is None
    assert list(elsewhere.iterdir()) == []
