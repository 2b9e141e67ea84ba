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
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.bundled import bundled_program

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
            request = json.loads(body or b"{}") if self.command == "POST" else {}
            if self.path == "/health":
                self._json(fake.health, {})
            elif self.path.endswith("/v1/models"):
                self._json(200, {"object": "list", "data": [{"id": fake.name}]})
            elif request.get("teapot"):
                self._json(418, {"error": {"message": "short and stout"}})
            elif request.get("close_delimited"):
                # No length, no chunks: the body ends when the connection closes.
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"all of it, " * 1000)
                self.close_connection = True
            elif request.get("stream"):
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
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
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
    pid: int = 0

    def log(self) -> str:
        return self.stderr.read_text()


class Start(Protocol):
    def __call__(self, backend_url: str, fallback: FakeUpstream | None, prefix: str = "", **config: Any) -> Gateway: ...


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """hostside/gateway.py as the host runs it: one file with the boundary modules it imports."""
    return bundled_program("gateway.py", tmp_path)


@pytest.fixture
def start_gateway(tmp_path: Path, program: Path) -> Iterator[Start]:
    procs: list[tuple[subprocess.Popen[bytes], Gateway]] = []

    def start(backend_url: str, fallback: FakeUpstream | None, prefix: str = "", **extra: Any) -> Gateway:
        port = _free_port()
        config = {"bind": "127.0.0.1", "port": port, "backend": backend_url,
                  "fallback": {"url": fallback.url + prefix, "model": HOSTED_MODEL} if fallback else None,
                  "served_name": SERVED, "health_every_s": 0.05, "timeout_s": 20, **extra}  # fmt: skip
        path = tmp_path / f"gateway-{port}.json"
        path.write_text(json.dumps(config))
        gateway = Gateway(port, tmp_path / f"gateway-{port}.stderr")
        env = {**os.environ, "KIMI_API_KEY": CLIENT_KEY, "KIMI_FALLBACK_API_KEY": FALLBACK_KEY}
        env.pop("NOTIFY_SOCKET", None)
        with open(gateway.stderr, "wb") as err:
            proc = subprocess.Popen([sys.executable, str(program), "--config", str(path)], stderr=err, env=env)
        gateway.pid = proc.pid
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
    # GETs and error statuses pass through as they are.
    assert json.loads(call(gateway, "GET", "/v1/models")[2]) == {"object": "list", "data": [{"id": "local-router"}]}
    status, _, body = call(gateway, "POST", "/v1/completions", {"teapot": True})
    assert (status, json.loads(body)) == (418, {"error": {"message": "short and stout"}})
    assert backend.api_calls()[-1].path == "/v1/completions"
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
    status, headers, body = call(gateway, "POST", "/v1/completions", {"close_delimited": True})
    assert (status, headers["Transfer-Encoding"], body) == (200, "chunked", b"all of it, " * 1000)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(f"POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
                  'Content-Length: 25\r\n\r\n{"close_delimited": true}'.encode())  # fmt: skip
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"chunked" not in head.lower()
    assert body == b"all of it, " * 1000


def test_the_gateway_does_not_start_without_its_keys_or_with_a_malformed_one(tmp_path: Path, program: Path) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": _free_port(), "backend": "http://127.0.0.1:9",
                                  "fallback": {"url": "https://api.example", "model": HOSTED_MODEL},
                                  "served_name": SERVED}))  # fmt: skip
    command = [sys.executable, str(program), "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIMI_")}

    def refusal(**keys: str) -> str:
        run = subprocess.run(command, capture_output=True, text=True, timeout=10, env={**env, **keys}, check=False)
        assert run.returncode == 1
        for key in keys.values():
            assert key.strip() not in run.stderr
        return run.stderr

    assert refusal() == "KIMI_API_KEY is not set: clients could not be told apart from anyone else\n"
    assert (
        refusal(KIMI_API_KEY=CLIENT_KEY) == f"{config}: a fallback is configured but KIMI_FALLBACK_API_KEY is not set\n"
    )
    # A newline in a key would split the Authorization header it goes into: refused before listening,
    # naming the variable and never showing the key.
    injected = "sk-hosted-" + "h" * 8 + "\nX-Injected: 1"
    assert refusal(KIMI_API_KEY=CLIENT_KEY, KIMI_FALLBACK_API_KEY=injected) == (
        "KIMI_FALLBACK_API_KEY: a control character at position 19 of 32: a key may hold only visible ASCII characters\n"
    )
    assert refusal(KIMI_API_KEY="sk-client c", KIMI_FALLBACK_API_KEY=FALLBACK_KEY) == (
        "KIMI_API_KEY: a space at position 10 of 11: a key may hold only visible ASCII characters\n"
    )


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        (
            "https://api.example/v1/../admin",
            "fallback.url: path '/v1/../admin': '..' segment is not allowed",
        ),
        ("https://api.example/tenant//v1", "fallback.url: path '/tenant//v1': empty segment"),
        ("https://user:pw@api.example", "fallback.url must hold no user, query or fragment"),
        ("https://api.example/?to=evil", "fallback.url must hold no user, query or fragment"),
        ("https://api.example/#x", "fallback.url must hold no user, query or fragment"),
        ("ftp://api.example", "fallback.url must be an http:// or https:// URL"),
    ],
)
def test_a_fallback_url_the_gateway_could_be_steered_by_is_refused_at_start(
    url: str, rule: str, tmp_path: Path, program: Path
) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps({"bind": "127.0.0.1", "port": _free_port(), "backend": "http://127.0.0.1:9",
                                  "fallback": {"url": url, "model": HOSTED_MODEL}, "served_name": SERVED}))  # fmt: skip
    env = {**os.environ, "KIMI_API_KEY": CLIENT_KEY, "KIMI_FALLBACK_API_KEY": FALLBACK_KEY}
    run = subprocess.run([sys.executable, str(program), "--config", str(config)], capture_output=True, text=True,
                         timeout=10, env=env, check=False)  # fmt: skip
    assert run.returncode == 1
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"{config}: {rule}")


def exchange(gateway: Gateway, request: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as raw bytes (no client library to tidy it up); the first answer's status, headers, body."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=timeout) as s:
        s.sendall(request)
        answer = http.client.HTTPResponse(s)
        answer.begin()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()


def raw_request(
    method: str,
    target: str | bytes,
    key: str | None = CLIENT_KEY,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method.encode(), target if isinstance(target, bytes) else target.encode())]
    lines.append(b"Host: evil.example")
    if key is not None:
        lines.append(f"Authorization: Bearer {key}".encode())
    if body or method == "POST":
        lines.append(b"Content-Type: application/json")
        lines.append(b"Content-Length: %d" % len(body))
    lines += [f"{name}: {value}".encode() for name, value in (headers or {}).items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


ATTACKS = [
    # Absolute-form: http.client would take Host and where to go from the client's URL.
    ("GET", "http://evil.example/steal", 400, "only origin-form targets"),
    ("POST", "http://evil.example/v1/chat/completions", 400, "only origin-form targets"),
    ("CONNECT", "evil.example:443", 400, "only origin-form targets"),
    ("OPTIONS", "*", 400, "only origin-form targets"),
    # Out of the allowed paths, plainly or percent-encoded.
    ("GET", "/v1/../../admin/keys", 400, "'..' segment is not allowed"),
    ("GET", "/v1/%2e%2e/admin", 400, "'..' segment is not allowed"),
    ("GET", "/v1/%2E%2E/%2e%2E/admin", 400, "'..' segment is not allowed"),
    ("GET", "/v1/./models", 400, "'.' segment is not allowed"),
    ("GET", "//v1/models", 400, "empty segment"),
    ("GET", "/v1/models/", 400, "empty segment"),
    ("GET", "/v1\\models", 400, "no backslash"),
    ("GET", "/v1/%5cmodels", 400, "%5c decodes to a character"),
    ("GET", "/v1%2fmodels", 400, "%2f decodes to a character"),
    ("GET", "/v1/models%00", 400, "%00 decodes to a character"),
    ("GET", "/v1/%zzmodels", 400, "not followed by two hex digits"),
    ("GET", "/v1/caf\u00e9".encode(), 400, "only visible ASCII"),
    ("GET", "/v1/models?next=http://evil.example", 400, "query strings are not served"),
    # Endpoints the hosted API (or the router's worker management) has, that clients are not given.
    ("POST", "/v1/files", 404, "'/v1/files' is not served here"),
    ("GET", "/admin/keys", 404, "'/admin/keys' is not served here"),
    ("POST", "/add_worker", 404, "'/add_worker' is not served here"),
    ("GET", "/v1/chat/completions", 405, "/v1/chat/completions takes POST, not GET"),
    ("DELETE", "/v1/models", 405, "/v1/models takes GET, not DELETE"),
]


@pytest.mark.parametrize(("method", "target", "status", "rule"), ATTACKS, ids=[f"{a[0]} {a[1]!r}" for a in ATTACKS])
def test_a_request_outside_the_allowed_endpoints_reaches_no_upstream(
    method: str, target: str | bytes, status: int, rule: str,
    backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start,
) -> None:  # fmt: skip
    backend.health = 503  # the fallback is active: a forwarded request would carry the hosted key
    gateway = start_gateway(backend.url, hosted)
    body = json.dumps({"model": SERVED, "messages": []}).encode() if method == "POST" else b""
    got, headers, answer = exchange(gateway, raw_request(method, target, body=body))
    assert got == status
    assert headers["content-type"] == "application/json"
    assert rule in json.loads(answer)["error"]["message"]
    if status == 405:
        assert headers["allow"] in ("GET", "POST")
    assert hosted.seen == []
    assert backend.api_calls() == []


def test_the_fallback_gets_its_own_host_and_only_allowed_paths_below_its_prefix(
    backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.health = 503
    gateway = start_gateway(backend.url, hosted, prefix="/tenant-a")
    body = json.dumps({"model": SERVED, "messages": []}).encode()
    status, _, answer = exchange(gateway, raw_request("POST", "/v1/chat/completions", body=body))
    assert (status, json.loads(answer)) == (200, {"answered_by": "hosted-api", "model": HOSTED_MODEL})
    assert exchange(gateway, raw_request("GET", "/v1/models"))[0] == 200
    # A '..' would climb out of the prefix on a server that normalises the path after us.
    for target in ("/v1/../../admin", "/v1/%2e%2e/%2e%2e/admin", "http://evil.example/tenant-a/v1/models"):
        assert exchange(gateway, raw_request("GET", target))[0] == 400
    assert [(s.method, s.path) for s in hosted.seen] == [
        ("POST", "/tenant-a/v1/chat/completions"),
        ("GET", "/tenant-a/v1/models"),
    ]
    # The client said "Host: evil.example": the fallback is told its own name, with the hosted key.
    host = hosted.url.removeprefix("http://")
    assert {s.headers["Host"] for s in hosted.seen} == {host}
    assert {s.headers["Authorization"] for s in hosted.seen} == {f"Bearer {FALLBACK_KEY}"}


def test_a_client_without_the_key_gets_no_100_continue_and_no_body_is_read(
    backend: FakeUpstream, start_gateway: Start
) -> None:
    gateway = start_gateway(backend.url, None)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(raw_request("POST", "/v1/chat/completions", key="wrong").replace(
            b"Content-Length: 0", b"Content-Length: 60000000\r\nExpect: 100-continue"))  # fmt: skip
        first = s.recv(65536)  # read raw: a client library would skip a "100 Continue"
        assert first.startswith(b"HTTP/1.1 401 ")
        assert b"\r\nConnection: close\r\n" in first
    # With the key, the client is told to go on, and its body goes through.
    body = json.dumps({"model": SERVED, "messages": []}).encode()
    request = raw_request("POST", "/v1/chat/completions", body=body, headers={"Expect": "100-continue"})
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(request[: -len(body)])
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(body)
        answer = http.client.HTTPResponse(s)
        answer.begin()
        assert (answer.status, json.loads(answer.read())["answered_by"]) == (200, "local-router")


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "request body: JSON nested deeper than 64 levels"),
        (
            b'{"model": "kimi-local", "messages": [' + b"[" * 5000 + b"]" * 5000 + b"]}",
            "request body: JSON nested deeper than 64 levels",
        ),
        (b'{"model": "kimi-local", "n": ' + b"9" * 5000 + b"}", "request body: not JSON: an integer over 4300 digits"),
        (b'{"model": "kimi-local", "temperature": NaN}', "request body: not JSON: NaN is not JSON"),
        (b"[1, 2]", "request body: must be a JSON object"),
        (b"model=kimi-local", "request body: not JSON: Expecting value"),
    ],
    ids=["nested-array", "nested-in-messages", "huge-int", "nan", "not-an-object", "form"],
)
def test_a_body_that_is_not_a_bounded_json_object_is_answered_400(
    body: bytes, rule: str, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.health = 503  # the fallback path decodes the body to rewrite its model
    gateway = start_gateway(backend.url, hosted)
    status, _, answer = exchange(gateway, raw_request("POST", "/v1/chat/completions", body=body))
    assert status == 400
    assert json.loads(answer)["error"]["message"].startswith(rule)
    assert hosted.seen == []


def test_a_health_check_with_a_body_does_not_smuggle_a_request(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None)
    smuggled = raw_request("GET", "/v1/models")
    request = b"GET /health HTTP/1.1\r\nContent-Length: %d\r\n\r\n%b" % (len(smuggled), smuggled)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(request)
        received = b""
        while chunk := s.recv(65536):  # the gateway closes the connection after one answer
            received += chunk
    assert received.count(b"HTTP/1.1 ") == 1
    assert received.startswith(b"HTTP/1.1 400 ")
    assert backend.api_calls() == []


def _closed_within(s: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[float, bytes]:
    """Seconds until the gateway closes ``s`` (sending ``trickle`` a byte every 0.2 s meanwhile), and what it said."""
    started = time.monotonic()
    said = b""
    s.settimeout(0.2)
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            if sent < len(trickle):
                try:
                    s.sendall(trickle[sent : sent + 1])
                except OSError:
                    return time.monotonic() - started, said
                sent += 1
            continue
        except ConnectionResetError:
            return time.monotonic() - started, said
        if not chunk:
            return time.monotonic() - started, said
        said += chunk
    raise AssertionError(f"still open after {seconds} s; said {said[:200]!r}")


def test_slow_idle_and_oversized_heads_are_cut_off(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None, header_timeout_s=1, idle_timeout_s=1)
    # A connection that says nothing, and one that sends its head a byte at a time (slowloris).
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        seconds, said = _closed_within(s, 5)
        assert (seconds < 2, said) == (True, b"")
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        seconds, said = _closed_within(s, 5, trickle=b"X-Slow: " + b"a" * 1000)
        assert seconds < 3
        assert said.startswith(b"HTTP/1.1 408 ")
    # A kept-alive connection is closed once idle.
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(raw_request("GET", "/v1/models"))
        time.sleep(0.3)
        seconds, said = _closed_within(s, 5)
        assert said.startswith(b"HTTP/1.1 200 ")
        assert seconds < 2
    # One header line of 65 KB, or 99 headers: refused while reading, before the key is even looked at.
    big = raw_request("GET", "/v1/models", headers={"X-Big": "a" * 65_000})
    many = raw_request("GET", "/v1/models", headers={f"X-H{i}": "v" for i in range(99)})
    for request, rule in ((big, "a header line over 8192 bytes"), (many, "more than 64 headers")):
        status, headers, answer = exchange(gateway, request)
        assert (status, headers["connection"]) == (431, "close")
        assert json.loads(answer)["error"]["message"] == rule
    assert len(backend.api_calls()) == 1  # the kept-alive connection's request only


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_connections_beyond_the_cap_are_answered_503_at_once(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None, max_connections=4, header_timeout_s=2)
    idle = [socket.create_connection(("127.0.0.1", gateway.port)) for _ in range(4)]
    try:
        time.sleep(0.3)
        status, headers, answer = exchange(gateway, raw_request("GET", "/v1/models"), timeout=1)
        assert (status, headers["connection"]) == (503, "close")
        assert json.loads(answer)["error"]["message"] == "too many connections: try again shortly"
        assert _threads(gateway.pid) <= 4 + 1
    finally:
        for s in idle:
            s.close()
    # The idle connections gave their places back when their head deadline passed (or they left).
    time.sleep(0.5)
    assert call(gateway, "GET", "/v1/models")[0] == 200
