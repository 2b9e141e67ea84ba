"""A rung's probe (hostside/context_probe.py) against an engine on loopback that reads what it
keeps of a prompt: one that reads all of it passes, one that silently drops the middle of long
prompts (as OpenRouter's "middle-out" transform does, or an engine truncating to fit) fails on
the needle, and one that refuses the prompt fails with its own words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kimi_deploy.engines import ENGINES
from kimi_deploy.hostside import context_probe
from kimi_deploy.recipe import ContextProbe
from tests.hostile_http import BAD_STATUS, ENDLESS, LONG_LINE, Hostile, answer, within
from tests.json_reply import send_json
from tests.loopback import serving

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

SERVED = "kimi-local"
# What the chat template adds to a message, in tokens (the engine's /tokenize counts it too).
TEMPLATE = 7


def _tokens(text: str) -> list[str]:
    return text.split()


class Engine(ThreadingHTTPServer):
    """Counts a token a word; answers the word after "code is" (the needle's), when the part of
    the prompt it keeps holds it. ``keep``: the tokens it keeps of a long prompt,
    half from the start and half from the end (None: all); ``refuse``: the length it refuses above."""

    daemon_threads = True

    def __init__(self) -> None:
        self.keep: int | None = None
        self.refuse: int | None = None
        self.asked: list[dict[str, Any]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body = b'vllm:kv_cache_usage_perc{engine="0",model_name="kimi-local"} 0.42\n'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                send_json(self, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                words = _tokens(body["messages"][0]["content"])
                if self.path == "/tokenize":
                    send_json(self, {"count": len(words) + TEMPLATE, "max_model_len": 1 << 20})
                    return
                engine.asked.append(body)
                if engine.refuse is not None and len(words) + TEMPLATE > engine.refuse:
                    self.send_response(400)
                    error = {
                        "error": {
                            "message": f"This model's maximum context length is {engine.refuse} tokens.",
                            "type": "BadRequestError",
                            "code": 400,
                        }
                    }
                    data = json.dumps(error).encode()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if engine.keep is not None and len(words) > engine.keep:
                    words = words[: engine.keep // 2] + words[-engine.keep // 2 :]
                pairs = range(len(words) - 2)
                said = next((words[i + 2].strip(".") for i in pairs if words[i : i + 2] == ["code", "is"]), "nothing")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunks: list[dict[str, Any]] = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
                chunks += [{"choices": [{"delta": {"content": piece}}]} for piece in (said, " .")]
                chunks.append(
                    {"choices": [], "usage": {"prompt_tokens": len(words) + TEMPLATE, "completion_tokens": 2}}
                )
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def engine() -> Iterator[Engine]:
    yield from serving(Engine())


def _request(engine: Engine | Hostile, **probe: Any) -> dict[str, Any]:
    url = engine.url if isinstance(engine, Hostile) else f"http://127.0.0.1:{engine.server_address[1]}"
    return {
        "unit": "kimi-test-engine",
        "smoke": {"url": url, "served_name": SERVED},
        "probe": ContextProbe(**probe).model_dump(mode="json"),
        "kv_metrics": list(ENGINES["vllm"].kv_usage_metrics),
    }


def test_an_engine_that_reads_the_whole_prompt_passes_a_prompt_that_fills_the_rung(engine: Engine) -> None:
    result = context_probe.measure(_request(engine), None, 32768, "run-1/32768")
    assert result["passed"], result
    # About 90% of the rung, as the engine counts it, never more.
    assert 0.97 * 0.9 * 32768 <= result["prompt_tokens"] <= 0.9 * 32768
    assert result["kv_cache_usage"] == 0.42
    assert result["ttft_s"] is not None
    (asked,) = engine.asked
    assert asked["stream"] is True
    assert asked["temperature"] == 0


def test_an_engine_that_drops_the_middle_fails_the_rung_on_the_needle(engine: Engine) -> None:
    engine.keep = 4096
    result = context_probe.measure(_request(engine), None, 32768, "run-1/32768")
    assert not result["passed"]
    assert result["reason"].startswith("the answer to a ")
    # (the engine reports the tokens it kept)
    assert result["reason"] == (
        "the answer to a 4103-token prompt lacks the needle's '4817' (answer 'nothing .'): "
        "the engine did not read the whole prompt"
    )
    # The same engine passes a rung whose prompt it keeps whole: the check is the needle, not the length.
    assert context_probe.measure(_request(engine), None, 4096, "run-1/4096")["passed"]


def test_a_refused_prompt_fails_the_rung_with_the_engines_words(engine: Engine) -> None:
    engine.refuse = 20000
    result = context_probe.measure(_request(engine), None, 32768, "run-1/32768")
    assert not result["passed"]
    assert result["reason"].startswith("the engine refused the probe's ")
    assert result["reason"].endswith("with status 400: This model's maximum context length is 20000 tokens.")


def test_each_rung_and_run_asks_with_words_of_its_own_and_never_the_answer(engine: Engine) -> None:
    probe = _request(engine)["probe"]
    one, two = context_probe.text(probe, "run-1/32768", 600), context_probe.text(probe, "run-2/32768", 600)
    assert one != two
    assert one.count("4817") == two.count("4817") == 1
    # The needle a quarter of the way in, the question last.
    words = one.split()
    assert 0.2 < words.index("vault") / len(words) < 0.3
    assert one.endswith("What is the vault code? Reply with the number only.")


# ---- whatever answers on the engine's port ----------------------------------------------------------------

KV = 'vllm:kv_cache_usage_perc{engine="0",model_name="kimi-local"} 0.42\n'
# the gauges the engines name (vLLM's, SGLang's)
GAUGES = ENGINES["vllm"].kv_usage_metrics + ENGINES["sglang"].kv_usage_metrics


def _sampled(page: str) -> float | None:
    """The KV cache use a sample of ``page`` (the engine's /metrics) reads."""
    with Hostile(answers={"/metrics": answer(page.encode(), kind="text/plain")}) as server:
        peaks = context_probe.Peaks(server.url, None, "kimi-test-engine", kv_metrics=GAUGES, accelerators=False)
        within(10, peaks.sample)
    return peaks.kv


def test_a_sample_is_read_line_by_line() -> None:
    # a sample's labels broken over two lines, and other series named alike, are no samples
    broken = 'vllm:kv_cache_usage_perc{engine="0",\nmodel_name="kimi-local"} 0.99\n'
    alike = 'vllm:kv_cache_usage_perc_total 0.98\nvllm:kv_cache_usage_perc{engine="1"} 0.97 x\n'
    assert _sampled(broken + alike + KV) == 0.42
    assert _sampled('sglang:token_usage{model_name="a}b"} 0.3 1700000000000\n') == 0.3  # a "}" in a label's value
    assert _sampled(broken) is None


def test_a_large_hostile_metrics_page_is_read_in_linear_time() -> None:
    # 1.5 MB of samples whose labels never close: a pattern free to cross lines goes back over the
    # rest of the page from each one (about 45 s of a root thread's time here)
    page = KV + 'vllm:kv_cache_usage_perc{engine="0",model_name="kimi-local"\n' * 25_000
    assert _sampled(page) == 0.42


@pytest.mark.parametrize(
    ("sent", "endless", "said"),
    [
        (BAD_STATUS, (), "not HTTP: status line 'HTTP/1.1 2OO OK'"),
        (LONG_LINE, (), "not HTTP: a header line over 65536 bytes"),
        (
            answer(b"data: " + b"[" * 150_000 + b"]" * 150_000 + b"\n\n", kind="text/event-stream"),
            (),
            "JSON nested deeper than 32 levels",
        ),
        (ENDLESS, ("/v1/chat/completions",), "no whole answer in 2 s"),
    ],
    ids=["bad-status", "long-line", "nested-json", "endless-body"],
)
def test_a_probe_answered_by_something_else_fails_the_rung_in_one_line(
    sent: bytes, endless: tuple[str, ...], said: str
) -> None:
    with Hostile(default=sent, endless=endless) as server:
        request = _request(server, timeout_s=2)
        result = within(20, lambda: context_probe.measure(request, None, 4096, "run-1/4096"))
    assert not result["passed"]
    assert result["reason"].startswith("the probe's request failed after ")
    assert result["reason"].endswith(f"s: engine at {server.url[7:]}: {said}")
    assert "\n" not in result["reason"]


def test_an_engine_that_names_no_gauge_has_none_read() -> None:
    """Where the engine's gauges of KV cache use are not known (``Engine.kv_usage_metrics`` empty:
    sglang-jax's, TokenSpeed's), the probe records none rather than another engine's."""
    assert ENGINES["tokenspeed"].kv_usage_metrics == ()
    with Hostile(answers={"/metrics": answer(KV.encode(), kind="text/plain")}) as server:
        peaks = context_probe.Peaks(server.url, None, "kimi-test-engine", kv_metrics=(), accelerators=False)
        within(10, peaks.sample)
    assert peaks.kv is None
