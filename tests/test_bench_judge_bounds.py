"""A model's answer built to break the judge (kimi_deploy/benchmark/judge.py): an answer nested
100,000 levels deep, in the text a JSON Schema rule reads or in a tool call's arguments, is judged
a failed task with its reason, and the level's report is made: never an exception that loses the
benchmark's report.
"""

from __future__ import annotations

from typing import Any

import pytest

from kimi_deploy.benchmark.judge import judge
from kimi_deploy.benchmark.report import level_report
from kimi_deploy.recipe import Benchmark, BenchTask

DEEP = "[" * 100_000
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
SCHEMA: dict[str, Any] = {"type": "array"}


def _task(expect: dict[str, Any], **more: Any) -> BenchTask:
    return BenchTask.model_validate({"id": "t", "prompt": "p", "expect": expect, **more})


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(DEEP, id="open-brackets"),
        pytest.param(DEEP + "]" * 100_000, id="closed-brackets"),
        pytest.param('{"a": ' * 100_000, id="open-objects"),
        pytest.param('["\\\\", ' + DEEP, id="after-an-escaped-backslash"),
    ],
)
def test_a_deeply_nested_answer_fails_its_json_schema_task_with_a_reason(answer: str) -> None:
    why = judge(_task({"json_schema": SCHEMA}), answer)
    assert why is not None
    assert why.splitlines() == [why]
    assert why.startswith("not one JSON value")
    assert "nested deeper than" in why
    assert len(why) < 300


def test_deeply_nested_tool_call_arguments_fail_the_task_with_a_reason() -> None:
    task = _task({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}, tools=[TOOL])
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": DEEP}}
    why = judge(task, "", [call])
    assert why is not None
    assert why.splitlines() == [why]
    assert why.startswith("get_weather called with arguments")
    assert "nested deeper than" in why


def test_an_answer_nested_as_deep_as_a_real_one_is_judged_as_before() -> None:
    value: Any = 1
    for _ in range(20):
        value = [value]
    nested = "[" * 20 + "1" + "]" * 20
    assert judge(_task({"json_schema": SCHEMA}), nested) is None
    assert (
        judge(_task({"json_schema": {"type": "object"}}), nested) == f"JSON schema: {value!r} is not of type 'object'"
    )


def test_the_level_report_is_made_with_the_hostile_answer_counted_as_failed() -> None:
    bench = Benchmark.model_validate(
        {"tasks": [{"id": "json", "prompt": "p", "expect": {"json_schema": SCHEMA}}], "concurrency": [1]}
    )
    level = {
        "concurrency": 1,
        "requests": [{"row": 0, "text": DEEP, "error": ""}, {"row": 0, "text": "[1, 2]", "error": ""}],
    }
    report = level_report(bench, "local", level, "cpu", 1.0)
    assert (report["requests"], report["succeeded"]) == (2, 1)
    assert report["failed_tasks"]["json"]["failed"] == 1
    assert "nested deeper than" in report["failed_tasks"]["json"]["first_reason"]
