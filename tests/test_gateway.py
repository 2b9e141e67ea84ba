"""The router host's gateway, run locally on loopback: a client, the gateway, the backend, the hosted API.

Real processes and sockets: Debian's nginx runs the deploy's own templates (harness/gateway_local.py), as
systemd starts it; the local router and the hosted API are small HTTP servers in this process that
record what reaches them, and the fallback's log lines arrive on a syslog socket, as at /dev/log.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import pytest

from harness.gateway_local import LocalGateway, nginx
from harness.gateway_local import start as start_local
from tests.json_reply import send_json

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]
CLIENT_KEY = "sk-client-" + "c" * 32
FALLBACK_KEY = "sk-hosted-" + "h" * 32
KEYS = {"KIMI_API_KEY": CLIENT_KEY, "KIMI_FALLBACK_API_KEY": FALLBACK_KEY}
SERVED = "kimi-local"
HOSTED_MODEL = "kimi-k3.1-pro"
HOSTED_MAX_TOKENS = 4096
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
    # A router whose engines are gone, as the real vllm-router 0.1.17 is (held to it by
    # tests/localcluster/test_standins.py::test_the_real_router_with_its_engines_gone): its /health
    # still 200 "All servers healthy", every request 500 "Request failed: error sending request
    # for url (...)"; once its health checks open the engines' circuits (about 40 s here), 503
    # "No workers are currently available" (``circuits_open``).
    down: bool = False
    circuits_open: bool = False
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
            send_json(self, doc, code)

        def _text(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def _serve(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            fake.seen.append(Seen(self.command, self.path, dict(self.headers.items()), body))
            try:
                request = json.loads(body or b"{}") if self.command == "POST" else {}
            except (ValueError, RecursionError):
                request = {}  # the hosted API's business: here, answered as any other
            request = request if isinstance(request, dict) else {}
            if fake.down and self.path != "/health":
                if fake.circuits_open:
                    self._text(503, "No workers are currently available")
                else:
                    self._text(500, f"Request failed: error sending request for url (http://10.0.0.9:8000{self.path})")
            elif self.path == "/health":
                self._json(200, {})
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


class Start(Protocol):
    def __call__(
        self, backend_url: str, fallback: FakeUpstream | None, prefix: str = "", **config: Any
    ) -> LocalGateway: ...


class Journal:
    """Where the gateway's fallback lines go: a syslog socket, as /dev/log on the host."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.1)

    def lines(self) -> list[str]:
        out: list[str] = []
        while True:
            try:
                message = self.sock.recv(65536).decode()
            except TimeoutError:
                return out
            out.append(message.split(": ", 1)[1] if message.startswith("<") else message)


@pytest.fixture
def journal() -> Iterator[Journal]:
    # nginx started by root runs its worker as "nobody", which must reach the socket, as on a host
    # (where nginx runs as its own user throughout) it reaches /dev/log.
    folder = Path(tempfile.mkdtemp(prefix="kimi-gateway-log-"))
    folder.chmod(0o755)
    j = Journal(folder / "log.sock")
    (folder / "log.sock").chmod(0o666)
    yield j
    j.sock.close()
    shutil.rmtree(folder)


@pytest.fixture
def start_gateway(tmp_path: Path, journal: Journal) -> Iterator[Start]:
    if nginx() is None:
        pytest.fail("nginx is not installed: scripts/test installs Debian's nginx and libnginx-mod-http-js")
    started: list[LocalGateway] = []

    def start(backend_url: str, fallback: FakeUpstream | None, prefix: str = "", **limits: Any) -> LocalGateway:
        port = _free_port()
        gateway = start_local(
            tmp_path / f"gateway-{port}",
            KEYS,
            port,
            backend_port=int(backend_url.rsplit(":", 1)[1]),
            fallback_url=fallback.url + prefix if fallback else None,
            served_name=SERVED,
            hosted_model=HOSTED_MODEL if fallback else None,
            hosted_max_tokens=HOSTED_MAX_TOKENS if fallback else None,
            fallback_log=f"syslog:server=unix:{journal.path}",
            timeout_s=20,
            **limits,
        )
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()
        # Whatever happened, neither key reaches the journal.
        assert CLIENT_KEY not in gateway.log()
        assert FALLBACK_KEY not in gateway.log()
    logged = "\n".join(journal.lines())
    assert CLIENT_KEY not in logged
    assert FALLBACK_KEY not in logged


def call(
    gateway: LocalGateway, method: str, path: str, doc: object = None, key: str | None = CLIENT_KEY
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
    assert seen.headers["Host"] == backend.url.removeprefix("http://")
    assert seen.body == json.dumps(request).encode()
    # GETs and error statuses other than the backend's "unavailable" pass through as they are.
    assert json.loads(call(gateway, "GET", "/v1/models")[2]) == {"object": "list", "data": [{"id": "local-router"}]}
    status, _, body = call(gateway, "POST", "/v1/completions", {"teapot": True})
    assert (status, json.loads(body)) == (418, {"error": {"message": "short and stout"}})
    assert backend.api_calls()[-1].path == "/v1/completions"
    assert call(gateway, "GET", "/health", key=None)[::2] == (200, b'{"backend":true,"fallback":false}')


@pytest.mark.parametrize("circuits_open", [False, True], ids=["engines-unreachable", "circuits-open"])
def test_an_unavailable_backend_sends_requests_to_the_hosted_api_with_its_key(
    circuits_open: bool, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start, journal: Journal
) -> None:
    backend.down, backend.circuits_open = True, circuits_open
    answered = 503 if circuits_open else 500
    gateway = start_gateway(backend.url, hosted)
    request = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "temperature": 0.6}
    status, _, body = call(gateway, "POST", "/v1/chat/completions", request)
    assert status == 200
    assert json.loads(body) == {"answered_by": "hosted-api", "model": HOSTED_MODEL}
    (seen,) = hosted.api_calls()
    assert seen.headers["Authorization"] == f"Bearer {FALLBACK_KEY}"
    assert json.loads(seen.body) == {**request, "model": HOSTED_MODEL, "max_tokens": HOSTED_MAX_TOKENS}
    # The hosted API's model list comes back as it is.
    assert json.loads(call(gateway, "GET", "/v1/models")[2]) == {"object": "list", "data": [{"id": "hosted-api"}]}
    # The service still answers, and so does the router's /health (it does not tell its engines gone).
    assert call(gateway, "GET", "/health", key=None)[::2] == (200, b'{"backend":true,"fallback":true}')
    host = hosted.url.removeprefix("http://")
    lines = journal.lines()
    assert f"fallback: POST /v1/chat/completions -> {host} (backend answered {answered})" in lines
    assert f"fallback: GET /v1/models -> {host} (backend answered {answered})" in lines
    # The backend back: the next request goes to it again.
    backend.down = False
    assert json.loads(call(gateway, "POST", "/v1/chat/completions", request)[2])["answered_by"] == "local-router"
    assert backend.api_calls()[-1].headers["Authorization"] == f"Bearer {CLIENT_KEY}"
    # Not listening at all is the same as unavailable, and the health says so.
    stopped = start_gateway(f"http://127.0.0.1:{_free_port()}", hosted)
    assert json.loads(call(stopped, "POST", "/v1/completions", request)[2])["answered_by"] == "hosted-api"
    assert call(stopped, "GET", "/health", key=None)[::2] == (200, b'{"backend":false,"fallback":true}')


H = HOSTED_MODEL.encode()
# What the fallback adds to a request that names no bound of its own.
CAP = b'"max_tokens": %d, ' % HOSTED_MAX_TOKENS


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        (
            b'{"model": "kimi-local", "messages": [' + b"[" * 500 + b"]" * 500 + b"]}",
            b"{" + CAP + b'"model": "%b", "messages": [' % H + b"[" * 500 + b"]" * 500 + b"]}",
        ),
        (
            b'{"seed": 12345678901234567890123, "m": {"model": "kimi-local"}, "model" : "kimi-local"}',
            b"{" + CAP + b'"seed": 12345678901234567890123, "m": {"model": "kimi-local"}, "model" : "%b"}' % H,
        ),
        (
            b' {"\\u006dodel": "kimi\\u002dlocal", "n": 1.50, "max_tokens": 1e2}\n',
            b' {"\\u006dodel": "%b", "n": 1, "max_tokens": 1e2}\n' % H,
        ),
        (
            b'{"model":"kimi-local","n":50,"max_completion_tokens":999999,"messages":[{"n":50,"max_tokens":9}]}',
            b'{"model":"%b","n":1,"max_completion_tokens":%d,"messages":[{"n":50,"max_tokens":9}]}'
            % (H, HOSTED_MAX_TOKENS),
        ),
        (
            b'{"model": "kimi-local", "max_tokens": null, "n": "50", "best_of": 20, "prompt": [1, 2, 3]}',
            b'{"model": "%b", "max_tokens": %d, "n": 1, "best_of": 1, "prompt": [1, 2, 3]}' % (H, HOSTED_MAX_TOKENS),
        ),
        (
            b'{"model": "kimi-local", "n": 1, "max_tokens": 64, "prompt": ["one"]}',
            b'{"model": "%b", "n": 1, "max_tokens": 64, "prompt": ["one"]}' % H,
        ),
    ],
    ids=["nested-in-messages", "big-seed", "escaped", "n-and-max-completion-tokens", "null-string-best-of", "within"],
)
def test_the_fallback_changes_the_served_name_and_the_bounds_alone(
    body: bytes, sent: bytes, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.down = True
    gateway = start_gateway(backend.url, hosted)
    status, _, _ = exchange(gateway, raw_request("POST", "/v1/chat/completions", body=body))
    (seen,) = hosted.api_calls()
    # The top-level served name becomes the hosted model's, and what the request may cost is held
    # to one answer of at most HOSTED_MAX_TOKENS; every other byte goes as the client sent it.
    assert seen.body == sent
    assert status == 200
    assert exchange(gateway, raw_request("GET", "/v1/models"))[0] == 200  # nginx still serves


# Bodies the hosted API never sees, and what the client is told.
REFUSED_BODIES = [
    (b'{"model": "gpt-4o", "messages": []}', '"model" must be "kimi-local"'),
    (b'{"model": "kimi-local", "messages": [], "model": "gpt-4o"}', 'names "model" more than once'),
    (b'{"model": "kimi-local", "\\u006dodel": "gpt-4o"}', 'names "model" more than once'),
    (b'{"model": "kimi-local", "n": 1, "messages": [], "n": 50}', 'names "n" more than once'),
    (b'{"messages": [{"model": "kimi-local"}]}', '"model" must be "kimi-local"'),
    (b'{"model": ["kimi-local"]}', '"model" must be "kimi-local"'),
    (b'{"model": "kimi-other", "n": ' + b"9" * 5000 + b"}", '"model" must be "kimi-local"'),
    (b"[" * 100_000 + b"]" * 100_000, "must be one JSON object"),
    (b'{"model": "kimi-local", "m": ' + b"[" * 2000 + b"]" * 2000 + b"}", "nests deeper than"),
    (b"model=kimi-local", "must be one JSON object"),
    (b"", "must be one JSON object"),
    (b'{"model": "kimi-local"} {"model": "gpt-4o"}', "must be one JSON object"),
    (b'{"model": "kimi-local" "model": "gpt-4o"}', "must be one JSON object"),
    (b'{"model": "kimi-local", "messages": [}', "must be one JSON object"),
    (b'{"model": "kimi-local", "n": 01}', "must be one JSON object"),
    (b'{"model": "kimi-local", "prompt": ["one", "two"]}', '"prompt" must be one prompt'),
    (b'{"model": "kimi-local", "prompt": [[1, 2], [3]]}', '"prompt" must be one prompt'),
]


@pytest.mark.parametrize(("body", "told"), REFUSED_BODIES, ids=[f"{i}" for i in range(len(REFUSED_BODIES))])
def test_the_fallback_refuses_any_request_but_one_bounded_answer_of_the_served_model(
    body: bytes, told: str, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.down = True  # a request that went on would carry the hosted key, at the hosted API's prices
    gateway = start_gateway(backend.url, hosted)
    for path in ("/v1/chat/completions", "/v1/completions"):
        status, headers, answer = exchange(gateway, raw_request("POST", path, body=body))
        assert (status, headers["content-type"]) == (400, "application/json")
        error = json.loads(answer)["error"]
        assert told in error["message"]
        assert error["type"] == "invalid_request_error"
    assert hosted.seen == []
    assert len(backend.api_calls()) == 2  # the local router was asked first, as ever
    assert exchange(gateway, raw_request("GET", "/v1/models"))[0] == 200  # nginx still serves


@pytest.mark.parametrize(
    "key",
    [None, "wrong", FALLBACK_KEY, CLIENT_KEY + "x", "Basic " + CLIENT_KEY, CLIENT_KEY.upper()],
    ids=["none", "wrong", "the-hosted-key", "longer", "basic", "case"],
)
def test_a_request_without_the_client_key_is_refused_and_reaches_no_upstream(
    key: str | None, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.down = True  # the fallback is what an anonymous caller would be after
    gateway = start_gateway(backend.url, hosted)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = key if key.startswith("Basic ") else f"Bearer {key}"
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": SERVED}), headers=headers)
    answer = conn.getresponse()
    assert answer.status == 401
    assert answer.getheader("WWW-Authenticate") == "Bearer"
    assert "API key" in json.loads(answer.read())["error"]["message"]
    # and the connection closes: a refused client holds no slot past its answer
    assert answer.getheader("Connection") == "close"
    conn.close()
    assert backend.seen == []
    assert hosted.seen == []


def test_no_fallback_and_the_backend_down_answers_503(backend: FakeUpstream, start_gateway: Start) -> None:
    backend.down = True
    # its engines gone (the router's /health still 200), then the router not listening at all
    for url, health in (
        (backend.url, (200, b'{"backend":true,"fallback":false}')),
        (f"http://127.0.0.1:{_free_port()}", (503, b'{"backend":false,"fallback":false}')),
    ):
        gateway = start_gateway(url, None)
        status, headers, body = call(gateway, "POST", "/v1/chat/completions", {"model": SERVED})
        assert status == 503
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body)["error"]["message"] == "the local backend is unavailable and no fallback is configured"
        assert call(gateway, "GET", "/health", key=None)[::2] == health


def test_a_streamed_answer_passes_through_as_it_comes(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None)
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    body = json.dumps({"model": SERVED, "stream": True, "messages": []})
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"},
    )
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
        s.sendall(
            f"POST /v1/completions HTTP/1.0\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
            'Content-Length: 25\r\n\r\n{"close_delimited": true}'.encode()
        )
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"chunked" not in head.lower()
    assert body == b"all of it, " * 1000


def exchange(gateway: LocalGateway, request: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as raw bytes (no client library to tidy it up); the first answer's status, headers, body."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=timeout) as s:
        s.sendall(request)
        answer = http.client.HTTPResponse(s, method=request.split(b" ", 1)[0].decode())
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


ALLOWED = {"/v1/chat/completions", "/v1/completions", "/v1/models"}
# Requests no upstream may see: refused with the status given.
REFUSED = [
    # Absolute-form: the target would name a host of the client's choosing.
    ("GET", "http://evil.example/steal", 400),
    ("POST", "http://evil.example/v1/chat/completions", 400),
    ("GET", "http://evil.example/v1/models", 400),
    ("CONNECT", "evil.example:443", 400),
    ("OPTIONS", "*", 400),
    # Out of the allowed paths, plainly or percent-encoded.
    ("GET", "/v1/../../admin/keys", 400),
    ("GET", "/v1/%2e%2e/admin", 404),
    ("GET", "/v1/%2E%2E/%2e%2E/%2e%2e/admin", 400),
    ("GET", "/v1/models/", 404),
    ("GET", "/v1\\models", 404),
    ("GET", "/v1/%5cmodels", 404),
    ("GET", "/v1/models%00", 400),
    ("GET", "/v1/caf\u00e9".encode(), 404),
    ("GET", "/v1/models?next=http://evil.example", 400),
    # Endpoints the hosted API (or the router's worker management) has, that clients are not given.
    ("POST", "/v1/files", 404),
    ("GET", "/admin/keys", 404),
    ("POST", "/add_worker", 404),
    ("GET", "/v1/chat/completions", 405),
    ("DELETE", "/v1/models", 405),
    ("HEAD", "/v1/models", 405),
]
# Spellings nginx reads as an allowed path: upstream gets that path alone, never the client's spelling.
NORMALISED = [
    ("GET", "/v1/./models"),
    ("GET", "//v1/models"),
    ("GET", "/v1%2fmodels"),
    ("GET", "/admin/../v1/models"),
    ("GET", "/v1/%6dodels"),
]


@pytest.mark.parametrize(("method", "target", "status"), REFUSED, ids=[f"{a[0]} {a[1]!r}" for a in REFUSED])
def test_a_request_outside_the_allowed_endpoints_reaches_no_upstream(
    method: str,
    target: str | bytes,
    status: int,
    backend: FakeUpstream,
    hosted: FakeUpstream,
    start_gateway: Start,
) -> None:
    backend.down = True  # the fallback is active: a forwarded request would carry the hosted key
    gateway = start_gateway(backend.url, hosted)
    body = json.dumps({"model": SERVED, "messages": []}).encode() if method == "POST" else b""
    got, _, _ = exchange(gateway, raw_request(method, target, body=body))
    assert got == status
    assert hosted.seen == []
    assert backend.seen == []


@pytest.mark.parametrize(("method", "target"), NORMALISED, ids=[f"{a[0]} {a[1]!r}" for a in NORMALISED])
def test_a_path_nginx_normalises_reaches_upstream_as_the_allowed_path_alone(
    method: str, target: str, backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.down = True
    gateway = start_gateway(backend.url, hosted, prefix="/tenant-a")
    assert exchange(gateway, raw_request(method, target))[0] == 200
    assert [(s.method, s.path) for s in backend.seen] == [("GET", "/v1/models")]
    assert [(s.method, s.path) for s in hosted.seen] == [("GET", "/tenant-a/v1/models")]


def test_the_fallback_gets_its_own_host_and_only_allowed_paths_below_its_prefix(
    backend: FakeUpstream, hosted: FakeUpstream, start_gateway: Start
) -> None:
    backend.down = True
    gateway = start_gateway(backend.url, hosted, prefix="/tenant-a")
    body = json.dumps({"model": SERVED, "messages": []}).encode()
    status, _, answer = exchange(gateway, raw_request("POST", "/v1/chat/completions", body=body))
    assert (status, json.loads(answer)) == (200, {"answered_by": "hosted-api", "model": HOSTED_MODEL})
    assert exchange(gateway, raw_request("GET", "/v1/models"))[0] == 200
    # A '..' would climb out of the prefix on a server that normalises the path after us.
    for target in ("/v1/../../admin", "/v1/%2e%2e/%2e%2e/admin", "http://evil.example/tenant-a/v1/models"):
        assert exchange(gateway, raw_request("GET", target))[0] in (400, 404)
    assert [(s.method, s.path) for s in hosted.seen] == [
        ("POST", "/tenant-a/v1/chat/completions"),
        ("GET", "/tenant-a/v1/models"),
    ]
    # The client said "Host: evil.example": the fallback is told its own name, with the hosted key,
    # and gets none of the client's other headers.
    host = hosted.url.removeprefix("http://")
    assert {s.headers["Host"] for s in hosted.seen} == {host}
    assert {s.headers["Authorization"] for s in hosted.seen} == {f"Bearer {FALLBACK_KEY}"}
    assert all("X-Forwarded-For" not in s.headers and "Cookie" not in s.headers for s in hosted.seen)


def test_a_client_without_the_key_is_refused_before_its_body_and_a_client_with_it_goes_on(
    backend: FakeUpstream, start_gateway: Start
) -> None:
    gateway = start_gateway(backend.url, None)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(
            raw_request("POST", "/v1/chat/completions", key="wrong").replace(
                b"Content-Length: 0", b"Content-Length: 60000000\r\nExpect: 100-continue"
            )
        )
        said = b""
        while b"HTTP/1.1 401 " not in said:  # nginx says "100 Continue" to throw the body away, then 401
            said += s.recv(65536)
    assert backend.seen == []
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


def test_a_health_check_with_a_body_does_not_smuggle_a_request(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None)
    smuggled = raw_request("GET", "/v1/models")
    request = b"GET /health HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(smuggled), smuggled)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as s:
        s.sendall(request)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    assert received.count(b"HTTP/1.1 ") == 1
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
        assert (seconds < 2.5, said) == (True, b"")
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        seconds, _ = _closed_within(s, 5, trickle=b"X-Slow: " + b"a" * 1000)
        assert seconds < 2.5
    # A kept-alive connection is closed once idle.
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(raw_request("GET", "/v1/models"))
        time.sleep(0.3)
        seconds, said = _closed_within(s, 5)
        assert said.startswith(b"HTTP/1.1 200 ")
        assert seconds < 2.5
    # One header line of 65 KB, or heads over two 4 KiB buffers: refused while reading, before the key is looked at.
    big = raw_request("GET", "/v1/models", headers={"X-Big": "a" * 65_000})
    many = raw_request("GET", "/v1/models", headers={f"X-H{i}": "v" * 1000 for i in range(99)})
    for request in (big, many):
        status, headers, _ = exchange(gateway, request)
        assert (status, headers["connection"]) == (400, "close")
    assert len(backend.api_calls()) == 1  # the kept-alive connection's request only


def test_requests_beyond_the_cap_are_answered_503_at_once(backend: FakeUpstream, start_gateway: Start) -> None:
    gateway = start_gateway(backend.url, None, max_connections=2)
    body = json.dumps({"model": SERVED, "stream": True, "messages": []}).encode()
    held = []
    try:
        for _ in range(2):  # two streams the backend holds open
            s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            s.sendall(raw_request("POST", "/v1/chat/completions", body=body))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(s)
        started = time.monotonic()
        status, _, _ = exchange(gateway, raw_request("GET", "/v1/models"), timeout=5)
        assert (status, time.monotonic() - started < 2) == (503, True)
    finally:
        backend.gate.set()
        for s in held:
            s.close()
    time.sleep(0.3)
    assert call(gateway, "GET", "/v1/models")[0] == 200


def test_connections_that_never_finish_a_request_leave_room_for_a_keyed_one(
    backend: FakeUpstream, start_gateway: Start
) -> None:
    # Timeouts longer than the test: only room, not a timeout, can let the keyed request in.
    gateway = start_gateway(backend.url, None, max_connections=16, header_timeout_s=30, idle_timeout_s=30)
    # More than 2 x 16 + 64 connections from one address, none with the key: heads never finished,
    # and bodies of refused requests trickled (nginx reads them to throw them away).
    held: list[socket.socket] = []
    try:
        for i in range(2 * 16 + 64 + 40):
            s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            if i % 2:
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
            else:
                request = raw_request("POST", "/v1/chat/completions", key=None)
                s.sendall(request.replace(b"Content-Length: 0", b"Content-Length: 1000000") + b"{")
            held.append(s)
        time.sleep(0.3)
        status, _, body = exchange(gateway, raw_request("GET", "/v1/models"), timeout=5)
        assert (status, json.loads(body)) == (200, {"object": "list", "data": [{"id": "local-router"}]})
    finally:
        for s in held:
            s.close()


def test_one_address_gets_its_share_of_the_requests_and_another_gets_in(
    backend: FakeUpstream, start_gateway: Start
) -> None:
    gateway = start_gateway(backend.url, None, max_connections=4, per_address=2)
    body = json.dumps({"model": SERVED, "stream": True, "messages": []}).encode()
    held = []
    try:
        for _ in range(2):  # a client's two streams, held open by the backend
            s = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            s.sendall(raw_request("POST", "/v1/chat/completions", body=body))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
            held.append(s)
        assert exchange(gateway, raw_request("GET", "/v1/models"), timeout=5)[0] == 503
        # Another client address (loopback has them all) is served.
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5, source_address=("127.0.0.2", 0)) as s:
            s.sendall(raw_request("GET", "/v1/models"))
            assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    finally:
        backend.gate.set()
        for s in held:
            s.close()
