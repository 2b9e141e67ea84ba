"""A hosted API for the tests and the benches: OpenAI's chat completions, answering from a table, recording calls.

It stands where a paid endpoint would (the gateway's fallback, the benchmark's comparison). What
the deploy relies on is the shape of OpenAI's chat completions API (platform.openai.com/docs/
api-reference/chat): ``POST /v1/chat/completions`` with ``Authorization: Bearer``, 401 without the
key; a ``chat.completion`` object, or with ``stream: true`` server-sent events of
``chat.completion.chunk`` objects (a ``delta`` per chunk, ``finish_reason`` on the last, a
``usage`` chunk with empty ``choices`` when ``stream_options.include_usage``), then
``data: [DONE]``; a function call as ``message.tool_calls`` of ``{"id", "type": "function",
"function": {"name", "arguments": <JSON text>}}``. The real vLLM answers in the same shape, which
tests/e2e/test_demo_real.py checks field by field against this one.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# prompt -> answer; a prompt not in the table is answered with DEFAULT
Answers = dict[str, str]
DEFAULT = "HOSTED"


class HostedApi:
    """Serves on ``address`` (an ephemeral port) until ``close``; ``seen`` holds every call."""

    def __init__(self, address: str, key: str, answers: Answers | None = None, calls: dict[str, Any] | None = None):
        self.key, self.answers, self.calls = key, answers or {}, calls or {}
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((address, 0), self._handler())
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> Callable[..., BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization")
                body = json.loads(raw or b"{}")
                with api.lock:
                    api.seen.append({"path": self.path, "authorization": auth, "body": body})
                if auth != f"Bearer {api.key}":
                    self._send(401, json.dumps({"error": {"message": "Incorrect API key provided"}}).encode())
                    return
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"error": {"message": "not found"}}).encode())
                    return
                self._answer(body)

            def _answer(self, body: dict[str, Any]) -> None:
                content = body["messages"][-1].get("content") or ""
                # a string, or content parts ({"type": "text", "text": ...}), as vLLM's benchmark client sends it
                parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
                prompt = "".join(str(p.get("text") or "") for p in parts if p.get("type") == "text")
                tools = body.get("tools") or []
                calls = []
                for tool in tools:
                    name = tool.get("function", {}).get("name")
                    if name in api.calls:
                        call = {"name": name, "arguments": json.dumps(api.calls[name])}
                        calls.append({"id": f"call-{len(api.seen)}", "type": "function", "function": call})
                text = None if calls else api.answers.get(prompt, DEFAULT)
                usage = {
                    "prompt_tokens": len(prompt.split()),
                    "completion_tokens": len((text or "").split()) or 1,
                }
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                head = {"id": "hosted-1", "created": 0, "model": body.get("model")}
                finish = "tool_calls" if calls else "stop"
                if not body.get("stream"):
                    message = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
                    answer = {**head, "object": "chat.completion", "usage": usage,
                              "choices": [{"index": 0, "finish_reason": finish, "message": message}]}  # fmt: skip
                    self._send(200, json.dumps(answer).encode())
                    return
                chunk = {**head, "object": "chat.completion.chunk"}
                events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
                for piece in re.findall(r"\s*\S+", text or ""):
                    events.append({**chunk, "choices": [{"index": 0, "delta": {"content": piece}}]})
                events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    events.append({**chunk, "choices": [], "usage": usage})
                stream = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
                self._send(200, stream, "text/event-stream")

        return Handler
