"""The engine's HTTP API, OpenAI-compatible as vLLM and SGLang serve it, from the stand-in's answers."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .answer import answer, count_tokens, text_of

_MAX_BODY = 16 << 20
# Paths every engine serves without an API key (SGLang also guards everything else, vLLM only /v1).
_OPEN_PATHS = ("/health", "/health_generate", "/metrics", "/version")
# Per-message overhead of a chat template, so that usage grows with the number of messages.
_MESSAGE_OVERHEAD = 3


@dataclass
class ServedModel:
    """What the API serves; ``guard_all`` is SGLang's key check on every path but the open ones."""

    engine: str
    version: str
    names: tuple[str, ...]
    root: str
    max_model_len: int
    api_key: str | None
    guard_all: bool


@dataclass
class Metrics:
    lock: threading.Lock = field(default_factory=threading.Lock)
    http: Counter[tuple[str, int]] = field(default_factory=Counter)
    success: Counter[tuple[str, str]] = field(default_factory=Counter)
    prompt_tokens: Counter[str] = field(default_factory=Counter)
    generation_tokens: Counter[str] = field(default_factory=Counter)

    def render(self, prefix: str) -> str:
        # vLLM 0.32.0 labels each series with its engine index and writes counters as floats
        # (tests/vllm_contract.py reads the real engine's /metrics the same way).
        engine = 'engine="0",' if prefix == "vllm" else ""

        def n(value: int) -> str:
            return f"{float(value)}" if prefix == "vllm" else f"{value}"

        with self.lock:
            lines = [
                f"# HELP {prefix}:request_success_total Count of successfully processed requests.",
                f"# TYPE {prefix}:request_success_total counter",
                *(
                    f'{prefix}:request_success_total{{{engine}finished_reason="{reason}",model_name="{model}"}} {n(c)}'
                    for (model, reason), c in sorted(self.success.items())
                ),
                f"# HELP {prefix}:prompt_tokens_total Number of prefill tokens processed.",
                f"# TYPE {prefix}:prompt_tokens_total counter",
                *(
                    f'{prefix}:prompt_tokens_total{{{engine}model_name="{m}"}} {n(c)}'
                    for m, c in sorted(self.prompt_tokens.items())
                ),
                f"# HELP {prefix}:generation_tokens_total Number of generation tokens processed.",
                f"# TYPE {prefix}:generation_tokens_total counter",
                *(
                    f'{prefix}:generation_tokens_total{{{engine}model_name="{m}"}} {n(c)}'
                    for m, c in sorted(self.generation_tokens.items())
                ),
                f"# HELP {prefix}:num_requests_running Number of requests in model execution batches.",
                f"# TYPE {prefix}:num_requests_running gauge",
                f"{prefix}:num_requests_running {n(0)}",
                "# HELP kimi_standin_http_requests_total HTTP requests by path and status.",
                "# TYPE kimi_standin_http_requests_total counter",
                *(
                    f'kimi_standin_http_requests_total{{code="{code}",path="{path}"}} {n}'
                    for (path, code), n in sorted(self.http.items())
                ),
            ]
        return "\n".join(lines) + "\n"


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 resets connections when a whole cluster calls at once.
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], model: ServedModel, ready: threading.Event, log: Callable[[str], None]
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.model = model
        self.ready = ready
        self.log = log
        self.metrics = Metrics()
        self.created = int(time.time())
        self.sequence = 0
        self.sequence_lock = threading.Lock()
        super().__init__(address, _Handler)

    def next_id(self, kind: str, content: str) -> str:
        with self.sequence_lock:
            self.sequence += 1
            n = self.sequence
        return f"{kind}-{hashlib.sha256(f'{n}/{content}'.encode()).hexdigest()[:24]}"


# The local cluster's fault knob (a drill's, never a behaviour of a real engine): while this file
# holds {"answer": TEXT}, every completion answers TEXT, with status 200, as an engine whose model
# or kernels went wrong would.
FAULTS = "/etc/kimi-standin-faults.json"


def _fault_answer() -> str | None:
    try:
        with open(FAULTS, encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    text = found.get("answer") if isinstance(found, dict) else None
    return text if isinstance(text, str) and text else None


def _error(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"

    # -- plumbing ------------------------------------------------------------------------------------

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # uvicorn's access log line, which is what journald shows for a real engine.
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        self.server.log(f'{client} - "{self.requestline}" {code}')

    def log_message(self, format: str, *args: Any) -> None:
        self.server.log(format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        path = urlsplit(self.path).path
        with self.server.metrics.lock:
            self.server.metrics.http[(path, status)] += 1
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _authorized(self, path: str) -> bool:
        key = self.server.model.api_key
        if not key or path in _OPEN_PATHS:
            return True
        if not self.server.model.guard_all and not path.startswith("/v1"):
            return True
        return self.headers.get("Authorization", "") == f"Bearer {key}"

    def _raw_body(self) -> bytes | None:
        """The request body, read before any answer so that a kept-alive connection stays in step."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= _MAX_BODY:
            self.close_connection = True
            self._json(400, _error("invalid Content-Length", "BadRequestError", 400))
            return None
        return self.rfile.read(length)

    def _body(self, raw: bytes) -> dict[str, Any] | None:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            self._json(400, _error(f"request body is not JSON: {exc}", "BadRequestError", 400))
            return None
        if not isinstance(body, dict):
            self._json(400, _error("request body must be a JSON object", "BadRequestError", 400))
            return None
        return body

    def _gate(self) -> str | None:
        """The request path when it may proceed; otherwise the answer (401, 503) is already sent."""
        path = urlsplit(self.path).path
        if not self._authorized(path):
            self._json(401, {"error": "Unauthorized"})
            return None
        if path in ("/health", "/health_generate"):
            self._send(200 if self.server.ready.is_set() else 503, b"")
            return None
        if not self.server.ready.is_set():
            self._json(503, _error("The model is still loading.", "ServiceUnavailableError", 503))
            return None
        return path

    # -- routes --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self._gate()
        if path is None:
            return
        model = self.server.model
        if path == "/v1/models":
            self._json(200, {"object": "list", "data": [self._card(name) for name in model.names]})
        elif path == "/version":
            self._json(200, {"version": model.version})
        elif path == "/metrics":
            self._send(200, self.server.metrics.render(model.engine).encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_POST(self) -> None:
        raw = self._raw_body()
        if raw is None:
            return
        path = self._gate()
        if path is None:
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"detail": "Not Found"})
            return
        body = self._body(raw)
        if body is None:
            return
        chat = path == "/v1/chat/completions"
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                message = "messages must be a non-empty list of objects"
                self._json(400, _error(message, "BadRequestError", 400, "messages"))
                return
            texts = [text_of(m.get("content")) for m in messages]
            users = [t for m, t in zip(messages, texts, strict=True) if m.get("role") == "user"]
            prompt = users[-1] if users else texts[-1]
            prompt_tokens = sum(count_tokens(t) + _MESSAGE_OVERHEAD for t in texts)
        else:
            raw_prompt = body.get("prompt")
            prompt = raw_prompt if isinstance(raw_prompt, str) else " ".join(map(str, raw_prompt or []))
            prompt_tokens = count_tokens(prompt)
        self._complete(body, chat, prompt, prompt_tokens)

    def _card(self, name: str) -> dict[str, Any]:
        model = self.server.model
        return {
            "id": name,
            "object": "model",
            "created": self.server.created,
            "owned_by": model.engine,
            "root": model.root,
            "parent": None,
            "max_model_len": model.max_model_len,
        }

    def _complete(self, body: dict[str, Any], chat: bool, prompt: str, prompt_tokens: int) -> None:
        model = self.server.model
        name = body.get("model") or model.names[0]
        if name not in model.names:
            # vLLM 0.32.0's words (tests/vllm_contract.py holds the stand-in and the real engine to them)
            aliases = f" Valid aliases: {', '.join(model.names)}." if model.engine == "vllm" else ""
            self._json(404, _error(f"The model `{name}` does not exist.{aliases}", "NotFoundError", 404, "model"))
            return
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            self._json(400, _error("max_tokens must be a positive integer", "BadRequestError", 400, "max_tokens"))
            return
        wanted = prompt_tokens + (limit or 0)
        if wanted > model.max_model_len:
            message = (
                f"This model's maximum context length is {model.max_model_len} tokens. However, you requested "
                f"{wanted} tokens ({prompt_tokens} in the messages, {limit or 0} in the completion). "
                "Please reduce the length of the messages or completion."
            )
            self._json(400, _error(message, "BadRequestError", 400, "input_tokens"))
            return
        words = (_fault_answer() or answer(prompt)).split(" ")
        finish = "stop"
        if limit is not None and len(words) > limit:
            words, finish = words[:limit], "length"
        content = " ".join(words)
        completion_tokens = count_tokens(content)
        with self.server.metrics.lock:
            self.server.metrics.success[(name, finish)] += 1
            self.server.metrics.prompt_tokens[name] += prompt_tokens
            self.server.metrics.generation_tokens[name] += completion_tokens
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }
        kind = "chatcmpl" if chat else "cmpl"
        reply_id = self.server.next_id(kind, content)
        if body.get("stream"):
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            self._stream(reply_id, name, chat=chat, words=words, finish=finish, usage=usage if with_usage else None)
            return
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": content, "tool_calls": [], "reasoning_content": None}
        else:
            choice["text"] = content
        self._json(
            200,
            {
                "id": reply_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": name,
                "choices": [choice],
                "usage": usage,
            },
        )

    def _stream(
        self, reply_id: str, name: str, *, chat: bool, words: list[str], finish: str, usage: dict[str, int] | None
    ) -> None:
        """Server-sent events, one word a chunk, then ``data: [DONE]``; the connection closes after it."""
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece: str | None, reason: str | None, role: bool = False) -> bytes:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
                if piece is not None:
                    delta["content"] = piece
                choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": reason}
            event = {"id": reply_id, "object": kind, "created": created, "model": name, "choices": [choice]}
            return f"data: {json.dumps(event)}\n\n".encode()

        events = [chunk(None, None, role=True)] if chat else []
        events += [chunk(w if i == 0 else " " + w, None) for i, w in enumerate(words)]
        events.append(chunk(None, finish))
        if usage is not None:
            tail = {"id": reply_id, "object": kind, "created": created, "model": name, "choices": [], "usage": usage}
            events.append(f"data: {json.dumps(tail)}\n\n".encode())
        events.append(b"data: [DONE]\n\n")
        with self.server.metrics.lock:
            self.server.metrics.http[(urlsplit(self.path).path, 200)] += 1
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event)
            self.wfile.flush()
