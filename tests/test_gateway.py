"""The router host's gateway, run locally on loopback: a client, the gateway, the backend, the hosted API.

Real processes and sockets: ``hostside/gateway.py`` runs as its own process with a config file and its
keys in the environment, as systemd starts it; the local router and the hosted API are small HTTP
servers in this process that record what reaches them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLIENT_KEY = "sk-client-" + "c" * 32
FALLBACK_KEY = "sk-hosted-" + "h" * 32
SERVED = "kimi-local"
HOSTED_MODEL = "kimi-k3.1-pro"
EVENTS = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeUpstream:
    """An OpenAI-compatible server: the local router or the hosted API."""

    name: str
    health: int = 200
    seen: list[Seen] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def api_calls(self) -> list[Seen]:
        return [s for s in self.seen if s.path != "/health"]


def _handler(fake: FakeUpstream) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, code: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            fake.seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
            if self.path == "/health":
                self._json(fake.health, {})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": fake.name}]})
            elif self.path.startswith("/v1/teapot"):
                self._json(418, {"error": {"message": "short and stout"}})
            elif self.path == "/v1/close-delimited":
                # No length, no chunks: the body ends when the connection closes.
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"all of it, " * 1000)
                self.close_connection = True
            elif json.loads(body or b"{}").get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, event in enumerate(EVENTS):
                    self.wfile.write(b"%x\r\n%b\r\n" % (len(event), event))
                    self.wfile.flush()
                    if i == 0:
                        fake.gate.wait(10)  # the rest only once the client has the first event
                self.wfile.write(b"0\r\n\r\n")
            else:
                request = json.loads(body)
                self._json(200, {"answered_by": fake.name, "model": request.get("model")})

    return Handler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def backend() -> Iterator[FakeUpstream]:
    yield from _serve_fake(FakeUpstream("local-router"))


@pytest.fixture
def hosted() -> Iterator[FakeUpstream]:
    yield from _serve_fake(FakeUpstream("hosted-api"))


def _serve_fake(fake: FakeUpstream) -> Iterator[FakeUpstream]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield fake
    finally:
        fake.gate.set()
        server.shutdown()
        server.server_close()


@dataclass
class Gateway:
    port: int
    stderr: Path

    def log(self) -> str:
        return self.stderr.read_text()


Start = Callable[[str, "FakeUpstream | None"], Gateway]


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[Start]:
    procs: list[tuple[subprocess.Popen[bytes], Gateway]] = []

    def start(backend_url: str, fallback: FakeUpstream | None) -> Gateway:
        port = _free_port()
        config = {"bind": "127.0.0.1", "port": port, "backend": backend_url,
                  "fallback": {"url": fallback.url, "model": HOSTED_MODEL} if fallback else None,
                  "served_name": SERVED, "health_every_s": 0.05, "timeout_s": 20}  # fmt: skip
        path = tmp_path / f"gateway-{port}.json"
        path.write_text(json.dumps(config))
        gateway = Gateway(port, tmp_path / f"gateway-{port}.stderr")
        env = {**os.environ, "KIMI_API_KEY": CLIENT_KEY, "KIMI_FALLBACK_API_KEY": FALLBACK_KEY}
        env.pop("NOTIFY_SOCKET", None)
        with open(gateway.stderr, "wb") as err:
            proc = subprocess.Popen([sys.executable, str(ROOT / "hostside/gateway.py"), "--config", str(path)],
                                    stderr=err, env=env)  # fmt: skip
        procs.append((proc, gateway))
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return gateway
            except OSError:
                assert proc.poll() is None, gateway.log()
                assert time.monotonic() < deadline, "the gateway did not listen within 10 s"
                time.sleep(0.05)

    yield start
    for proc, gateway in procs:
        proc.terminate()
        proc.wait(timeout=10)
        # Whatever happened, neither key reaches the journal.
        assert CLIENT_KEY not in gateway.log()
        assert FALLBACK_KEY not in gateway.log()


def call(
    gateway: Gateway, method: str, path: str, doc: object = None, key: str | None = CLIENT_KEY
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = None
    if doc is not None:
        body = json.dumps(doc).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


def test_a_healthy_backend_gets_the_request_unchanged(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None)
    request = {"model": SERVED, "messages": [{"role": "user", "content": "héllo"}], "max_tokens": 8}
    status, headers, body = call(gateway, "POST", "/v1/chat/completions", request)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"answered_by": "local-router", "model": SERVED}
    (seen,) = backend.api_calls()
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["Authorization"] == f"Bearer {CLIENT_KEY}"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.body == json.dumps(request).encode()
    # GETs, query strings and error statuses pass through as they are.
    assert json.loads(call(gateway, "GET", "/v1/models")[2]) == {"object": "list", "data": [{"id": "local-router"}]}
    status, _, body = call(gateway, "GET", "/v1/teapot?x=1")
    assert (status, json.loads(body)) == (418, {"error": {"message": "short and stout"}})
    assert backend.api_calls()[-1].path == "/v1/teapot?x=1"
    assert call(gateway, "GET", "/health", key=None)[::2] == (200, b'{"backend": true, "fallback": false}')


def test_an_unhealthy_backend_sends_requests_to_the_hosted_api_with_its_key(
    backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.health = 503
    gateway = start_gateway(backend.url, hosted)
    request = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.6}
    status, _, body = call(gateway, "POST", "/v1/chat/completions", request)
    assert status == 200
    assert json.loads(body) == {"answered_by": "hosted-api", "model": HOSTED_MODEL}
    (seen,) = hosted.api_calls()
    assert seen.headers["Authorization"] == f"Bearer {FALLBACK_KEY}"
    assert json.loads(seen.body) == {**request, "model": HOSTED_MODEL}
    assert backend.api_calls() == []
    # Only the served name is rewritten; the hosted API's model list comes back as it is.
    call(gateway, "POST", "/v1/chat/completions", {"model": "kimi-k3.1-lite", "messages": []})
    assert json.loads(hosted.api_calls()[-1].body)["model"] == "kimi-k3.1-lite"
    assert json.loads(call(gateway, "GET", "/v1/models")[2]) == {"object": "list", "data": [{"id": "hosted-api"}]}
    # The service still answers, so its health says 200 and why.
    assert call(gateway, "GET", "/health", key=None)[::2] == (200, b'{"backend": false, "fallback": true}')
    assert backend.api_calls() == []
    host = hosted.url.removeprefix("http://")
    lines = gateway.log().splitlines()
    assert f"fallback: POST /v1/chat/completions -> {host} (backend unhealthy)" in lines
    assert f"fallback: GET /v1/models -> {host} (backend unhealthy)" in lines
    # The backend back: requests go to it again after the next health probe.
    backend.health = 200
    time.sleep(0.2)
    assert json.loads(call(gateway, "POST", "/v1/chat/completions", request)[2])["answered_by"] == "local-router"
    assert backend.api_calls()[-1].headers["Authorization"] == f"Bearer {CLIENT_KEY}"


@pytest.mark.parametrize(
    "key",
    [None, "wrong", FALLBACK_KEY, CLIENT_KEY + "x", "Basic " + CLIENT_KEY],
    ids=["none", "wrong", "the-hosted-key", "longer", "basic"],
)
def test_a_request_without_the_client_key_is_refused_and_reaches_no_upstream(
    key: str | None, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.health = 503  # the fallback is what an anonymous caller would be after
    gateway = start_gateway(backend.url, hosted)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = key if key.startswith("Basic ") else f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": SERVED}), headers=headers)
    answer = conn.getresponse()
    assert answer.status == 401
    assert "API key" in json.loads(answer.read())["error"]["message"]
    conn.close()
    assert backend.api_calls() == []
    assert hosted.api_calls() == []


def test_no_fallback_and_the_backend_down_answers_503(backend: FakeUpstream, start_gateway: Start) -> None:
    backend.health = 503
    for url in (backend.url, f"http://127.0.0.1:{_free_port()}"):  # unhealthy, then not listening at all
        gateway = start_gateway(url, None)
        status, headers, body = call(gateway, "POST", "/v1/chat/completions", {"model": SERVED})
        assert status == 503
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body)["error"]["message"] == "the local backend is unhealthy and no fallback is configured"
        assert call(gateway, "GET", "/health", key=None)[::2] == (503, b'{"backend": false, "fallback": false}')
    assert backend.api_calls() == []


def test_a_streamed_answer_passes_through_as_it_comes(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    body = json.dumps({"model": SERVED, "stream": True, "messages": []})
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"})  # fmt: skip
    answer = conn.getresponse()
    assert answer.status == 200
    assert answer.getheader("Content-Type") == "text/event-stream"
    assert answer.getheader("Transfer-Encoding") == "chunked"
    assert answer.getheader("Content-Length") is None
    # The backend holds the rest back until the client has the first event: a buffering gateway times out here.
    received = b""
    while len(received) < len(EVENTS[0]):
        received += answer.read1(65536)
    assert received == EVENTS[0]
    backend.gate.set()
    received += answer.read()
    assert received == b"".join(EVENTS)
    # The connection is still good for the next request.
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
    assert conn.getresponse().read() == b'{"object": "list", "data": [{"id": "local-router"}]}'
    conn.close()


def test_a_close_delimited_answer_reaches_http11_and_http10_clients_intact(
    backend: FakeUpstream, start_gateway: Start
) -> None:
    gateway = start_gateway(backend.url, None)
    status, headers, body = call(gateway, "GET", "/v1/close-delimited")
    assert (status, headers["Transfer-Encoding"], body) == (200, "chunked", b"all of it, " * 1000)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(f"GET /v1/close-delimited HTTP/1.0\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"chunked" not in head.lower()
    assert body == b"all of it, " * 1000


def test_the_gateway_does_not_start_without_its_keys(tmp_path: Path) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": _free_port(), "backend": "http://127.0.0.1:9",
                                  "fallback": {"url": "https://api.example", "model": HOSTED_MODEL},
                                  "served_name": SERVED}))  # fmt: skip
    command = [sys.executable, str(ROOT / "hostside/gateway.py"), "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_")}
    run = subprocess.run(command, capture_output=True, text=True, timeout=10, env=env, check=False)
    assert run.returncode == 1
    assert run.stderr.strip() == "KIMI_API_KEY is not set: clients could not be told apart from anyone else"
    run = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False,
                         env={**env, "KIMI_API_KEY": CLIENT_KEY})  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.strip() == f"{config}: a fallback is configured but KIMI_FALLBACK_API_KEY is not set"
