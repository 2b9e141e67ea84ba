"""Each acceptance rule of a benchmark task (kimi_deploy/benchmark/judge.py): success is counted from
the answer, and each failure says why."""

from __future__ import annotations

from typing import Any

import pytest

from kimi_deploy.benchmark.judge import judge
from kimi_deploy.recipe import BenchTask

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _task(expect: dict[str, Any], **more: Any) -> BenchTask:
    return BenchTask.model_validate({"id": "t", "prompt": "p", "expect": expect, **more})


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_exact_is_the_whole_answer_less_surrounding_space() -> None:
    task = _task({"exact": "READY"})
    # vLLM's text of the tiny Llama's answer starts with the space its tokenizer joins words with
    assert judge(task, " READY") is None
    assert judge(task, "READY\n") is None
    assert judge(task, "READY.") == "expected exactly 'READY', found 'READY.'"
    assert judge(task, "not READY") is not None
    assert judge(task, "") == "expected exactly 'READY', found ''"


def test_regex_searches_the_answer() -> None:
    task = _task({"regex": r"(?i)\bcanberra\b"})
    assert judge(task, "The capital is Canberra.") is None
    assert judge(task, "Canberras") is not None
    assert judge(task, "Sydney") == r"no match for /(?i)\bcanberra\b/ in 'Sydney'"


def test_json_schema_takes_one_json_value_the_schema_accepts() -> None:
    schema = {"type": "object", "required": ["name", "year"], "properties": {"year": {"type": "integer"}}}
    task = _task({"json_schema": schema})
    assert judge(task, ' {"name": "Ada", "year": 1843}\n') is None
    assert judge(task, '{"name": "Ada", "year": "1843"}') == "JSON schema: '1843' is not of type 'integer'"
    assert judge(task, '{"name": "Ada"}') == "JSON schema: 'year' is a required property"
    # prose around it, or a code fence, is not one JSON value
    assert judge(task, 'Here: {"name": "Ada", "year": 1843}').startswith("not one JSON value")  # type: ignore[union-attr]
    assert judge(task, '```json\n{"name": "Ada", "year": 1843}\n```').startswith("not one JSON value")  # type: ignore[union-attr]


def test_a_tool_call_needs_the_function_and_every_argument_expected() -> None:
    task = _task({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}, tools=[TOOL])
    assert judge(task, "", [_call("get_weather", '{"city": "Paris", "unit": "celsius"}')]) is None
    # arguments already decoded count the same
    assert judge(task, "", [_call("get_weather", {"city": "Paris"})]) is None
    assert judge(task, "", [_call("get_weather", '{"city": "Lyon"}')]) == (
        "get_weather called with {'city': 'Lyon'}, expected {'city': 'Paris'}"
    )
    assert judge(task, "", [_call("get_weather", "{city: Paris")]).startswith("get_weather called with arguments")  # type: ignore[union-attr]
    assert judge(task, "", [_call("get_time", "{}")]) == "called ['get_time'], expected get_weather"
    assert judge(task, "It is sunny in Paris.", []) == "no tool call (expected get_weather)"
    assert judge(task, "", None) == "no tool call (expected get_weather)"
    # entries that are not calls are passed over
    assert judge(task, "", ["junk", {"function": "x"}, _call("get_weather", '{"city": "Paris"}')]) is None


def test_a_call_without_expected_arguments_passes_on_the_name() -> None:
    task = _task({"tool_call": {"name": "get_weather"}}, tools=[TOOL])
    assert judge(task, "", [_call("get_weather", "{}")]) is None


@pytest.mark.parametrize("text", ["\x00\x1b[31m", "9" * 5000, '{"a": ' * 50])
def test_whatever_the_answer_holds_the_reason_is_one_short_line(text: str) -> None:
    for expect in ({"exact": "x"}, {"regex": "x"}, {"json_schema": {"type": "object"}}):
        why = judge(_task(expect), text)
        assert why is not None
        assert "\n" not in why, why
        assert "\x1b" not in why, why
        assert len(why) < 400, why
