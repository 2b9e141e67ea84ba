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

A recipe sends a hosted key in the clear only to loopback (``router.fallback.url``,
``benchmark.compare``), so on the local cluster the API also listens on 127.0.0.1 inside the network
namespace of the host that calls it (``loopback_of``): that host's own loopback, as a hosted API
reached through a local proxy would be; the key never crosses the cluster's network.
"""

from __future__ import annotations

import ctypes
import json
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# prompt -> answer; a prompt not in the table is answered with DEFAULT
Answers = dict[str, str]
DEFAULT = "HOSTED"
# setns(2)'s flag for a network namespace.
CLONE_NEWNET = 0x40000000
NETNS = Path("/run/netns")


def netns_of(address: str) -> str:
    """The named network namespace (``ip netns``) one of whose interfaces holds ``address``."""
    for ns in sorted(NETNS.iterdir()) if NETNS.is_dir() else []:
        command = ["ip", "-n", ns.name, "-j", "-4", "addr", "show"]
        shown = subprocess.run(command, capture_output=True, text=True, check=False)
        links = json.loads(shown.stdout or "[]") if shown.returncode == 0 else []
        if any(a.get("local") == address for link in links for a in link.get("addr_info", [])):
            return ns.name
    raise LookupError(f"no network namespace under {NETNS} holds {address}")


def loopback_listener(address: str) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (an ephemeral port) of the host at ``address`` (root
    only): made inside that host's network namespace, where it stays, by a thread that enters it
    and comes back (gevent's threads included: they share one system thread)."""
    libc = ctypes.CDLL(None, use_errno=True)

    def enter(ns: int, what: str) -> None:
        if libc.setns(ns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {what}")

    with open("/proc/thread-self/ns/net", "rb") as home, open(NETNS / netns_of(address), "rb") as there:
        enter(there.fileno(), f"the network namespace of {address}")
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
        finally:
            enter(home.fileno(), "this thread's own network namespace")
    return listener


def serve_on_loopback_of(address: str, handler: Callable[..., BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A server of ``handler`` on the loopback of the host at ``address`` (:func:`loopback_listener`),
    serving from a thread of its own until ``shutdown``; its port is ``server_address[1]``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = loopback_listener(address)
    server.server_address = server.socket.getsockname()
    server.server_name, server.server_port = "localhost", server.server_address[1]
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class HostedApi:
    """Serves on ``address`` (an ephemeral port) at ``url``, and with ``loopback_of`` on that host's
    own loopback at ``loopback_url`` (what a recipe names), until ``close``; ``seen`` holds every call."""

    def __init__(
        self,
        address: str,
        key: str,
        answers: Answers | None = None,
        calls: dict[str, Any] | None = None,
        loopback_of: str | None = None,
    ):
        self.key, self.answers, self.calls = key, answers or {}, calls or {}
        self.seen: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer((address, 0), self._handler())
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.servers = [self.server]
        self.loopback_url = self.url
        if loopback_of is not None:
            self.servers.append(serve_on_loopback_of(loopback_of, self._handler()))
            self.loopback_url = f"http://127.0.0.1:{self.servers[-1].server_address[1]}"

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()

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
                    answer = {
                        **head,
                        "object": "chat.completion",
                        "usage": usage,
                        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                    }
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
