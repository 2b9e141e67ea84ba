"""The recipe's serving benchmark section: each fault is one line naming the field and the rule."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.benchmark.plan import bench_topology
from kimi_deploy.recipe_file import load_recipe
from tests.test_recipe_errors import BASE, _error, _write

Mutation = Callable[[dict[str, Any]], None]


def _task(index: int, **values: Any) -> Mutation:
    return lambda tree: tree["benchmark"]["tasks"][index].update(values)


def _bench(**values: Any) -> Mutation:
    return lambda tree: tree["benchmark"].update(values)


def _cost(**values: Any) -> Mutation:
    return lambda tree: tree["benchmark"]["cost"].update(values)


CASES: list[tuple[str, Mutation, str]] = [
    (
        "two-rules",
        _task(0, expect={"exact": "a", "regex": "b"}),
        "benchmark.tasks[0].expect: give exactly one of exact, regex, json_schema or tool_call, found ['exact', 'regex']",
    ),
    (
        "no-rule",
        _task(0, expect={}),
        "benchmark.tasks[0].expect: give exactly one of exact, regex, json_schema or tool_call, found none",
    ),
    (
        "bad-regex",
        _task(0, expect={"regex": "(unclosed"}),
        "benchmark.tasks[0].expect: regex: '(unclosed' is not a Python regular expression: missing ), "
        "unterminated subpattern at position 0",
    ),
    (
        "bad-schema",
        _task(0, expect={"json_schema": {"type": "objekt"}}),
        "benchmark.tasks[0].expect: json_schema: not a JSON Schema (2020-12): 'objekt' is not valid under any of "
        "the given schemas",
    ),
    (
        "tool-not-offered",
        _task(3, expect={"tool_call": {"name": "get_time"}}),
        "benchmark.tasks[3]: expect.tool_call.name: 'get_time' is not a function of tools ['get_weather']",
    ),
    (
        "tools-without-call",
        lambda t: t["benchmark"]["tasks"][0].update(tools=t["benchmark"]["tasks"][3]["tools"]),
        "benchmark.tasks[0]: tools: only a task whose expect is a tool_call offers tools",
    ),
    (
        "duplicate-ids",
        _task(1, id="capital"),
        "benchmark: tasks: ids must be unique, ['capital'] appear more than once",
    ),
    (
        "escape-in-prompt",
        _task(0, prompt="say \x1b[2J"),
        "benchmark.tasks[0].prompt: control character U+001B is refused in text that reaches a host's files, "
        "found 'say \\x1b[2J'",
    ),
    ("falling-concurrency", _bench(concurrency=[4, 1]), "benchmark: concurrency must rise strictly, found [4, 1]"),
    ("unknown-topology", _bench(topology="nope"), "benchmark.topology: 'nope' is not a topology of this recipe"),
    (
        "not-vllm",
        _bench(topology="tpu7x"),
        "benchmark.topology: 'tpu7x' serves with sglang-jax; the load generator is vllm's (bench serve), "
        "from the release of a topology it serves",
    ),
    (
        "no-price",
        _cost(accelerator_hour={"H200": 3.8}),
        "benchmark.cost.accelerator_hour: no price for 'B300' (the accelerators of the topology benchmarked), "
        "found ['H200']",
    ),
    (
        "negative-price",
        _cost(storage_network_month=-1),
        "benchmark.cost.storage_network_month: Input should be greater than or equal to 0, found int -1",
    ),
    (
        "currency",
        _cost(currency="usd"),
        "benchmark.cost.currency: String should match pattern '^[A-Z]{3}$', found str 'usd'",
    ),
    (
        "compare-url",
        _bench(compare={"url": "ftp://x", "api_key": {"env": "K"}, "model": "m"}),
        "benchmark.compare.url: String should match pattern '^https?://[^\\s/?#]+(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*/?$', "
        "found str 'ftp://x'",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i) for i, m, e in CASES])
def test_a_bad_benchmark_gives_one_exact_line(tmp_path: Path, mutate: Mutation, expected: str) -> None:
    tree = copy.deepcopy(BASE)
    mutate(tree)
    path = _write(tmp_path, tree)
    assert _error(path) == f"{path}: {expected}"


def test_a_prompt_keeps_its_lines_and_tabs(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    tree["benchmark"]["tasks"][0]["prompt"] = "Example:\n\tQ: 1 + 1\n\tA: 2\nQ: 2 + 2"
    bench = load_recipe(_write(tmp_path, tree)).benchmark
    assert bench is not None
    assert bench.tasks[0].prompt == "Example:\n\tQ: 1 + 1\n\tA: 2\nQ: 2 + 2"


def test_without_a_topology_named_the_first_vllm_one_is_benchmarked(tmp_path: Path) -> None:
    tree = copy.deepcopy(BASE)
    del tree["benchmark"]["topology"]
    recipe = load_recipe(_write(tmp_path, tree))
    assert bench_topology(recipe) == next(n for n, t in recipe.topologies.items() if t.engine == "vllm")
    del tree["benchmark"]
    assert load_recipe(_write(tmp_path, tree)).benchmark is None
