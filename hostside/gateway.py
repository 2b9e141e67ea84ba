"""Answer the cluster's OpenAI-compatible API on the router host, with the hosted API as fallback.

Run as a systemd service in front of the local router:
``kimi-gateway.py --config /etc/kimi/kimi-gateway.json``. The config is JSON:
{"bind", "port", "backend": "http://127.0.0.1:8009", "fallback": {"url", "model"} | null,
"served_name", "health_every_s" (default 2.0), "timeout_s" (default 600), "max_connections"
(default 1024), "header_timeout_s" (default 5), "idle_timeout_s" (default 15)}. Two secrets come
from the environment (a root-only EnvironmentFile that systemd reads): ``KIMI_API_KEY``, the key
clients must present, and ``KIMI_FALLBACK_API_KEY``, the hosted API's key (required only with a
fallback); each is visible ASCII. A missing or malformed key or a bad config stops the program
before it listens, with one line naming the problem (never the key).

What a client may ask for (every other request is refused before it reaches anyone):
- ``GET /health``, no key, no body: 200 while the backend's ``/health`` answers 200, 200 too while
  it does not but a fallback is configured, else 503; the body is {"backend": bool, "fallback": bool}.
- With ``Authorization: Bearer <KIMI_API_KEY>`` (else 401, checked before any body is read):
  ``POST /v1/chat/completions``, ``POST /v1/completions`` (a JSON object body) and
  ``GET /v1/models`` (no body). These are the OpenAI-compatible endpoints both routers serve for a
  generative model (vllm-router's ``src/server.rs`` routes them to the engines; its other routes
  manage workers and are not for clients; vLLM's ``/v1/embeddings`` and ``/v1/rerank`` exist only for
  pooling models). Another path is 404, another method 405.
- Request targets are origin-form only (``GET http://host/x``, ``CONNECT host:443`` and
  ``OPTIONS *`` are 400); the path is percent-decoded once and must have no ``.``, ``..`` or empty
  segment, backslash, control or non-ASCII character (``hostside/boundary_http.py``). No endpoint
  takes a query string, so one is refused (400). What goes upstream is the matched path from the
  list above, after the upstream URL's own path prefix, with ``Host`` set from the upstream URL.
- A request head is at most 32 KiB (64 headers, 8 KiB a line) and must arrive within
  ``header_timeout_s`` of its first byte (a new connection's first byte within that time too; a
  kept-alive connection's next request within ``idle_timeout_s``), else 431/414/408 and the
  connection is closed. At most ``max_connections`` connections are served at once (one thread
  each); beyond that a new connection gets 503 and is closed. A body is at most 64 MiB (413),
  JSON nested at most 64 levels (400).

Where an allowed request goes:
- backend healthy (its ``/health`` probed at most every ``health_every_s``): to the backend with
  method, body, Content-Type, Accept and Authorization unchanged;
- else with a fallback: to the fallback with the hosted key instead of the client's, and a JSON
  body's "model" equal to ``served_name`` becomes ``fallback.model``; one stderr line per request:
  ``fallback: POST /v1/chat/completions -> api.moonshot.ai (backend unhealthy)``;
- else 503.
The answer's status, Content-Type and body come back as the upstream sends them, streamed: with the
upstream's Content-Length when it gives one, else ``Transfer-Encoding: chunked`` (close-delimited for
HTTP/1.0 clients), each piece forwarded as it arrives, so ``stream: true`` events are not held back.
An upstream that cannot be reached gives 502. Errors are OpenAI-style JSON
{"error": {"message", "type"}}, the message one line. Keys are never logged.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import io
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast
from urllib.parse import urlsplit

from hostside.boundary_http import BoundedThreads, Head, Refused, check_key, read_head, request_path
from hostside.boundary_json import loads
from hostside.boundary_text import shown

MAX_BODY = 64 * 1024 * 1024
MAX_DEPTH = 64  # tool schemas nest; nothing a model is asked nests deeper
CHUNK = 64 * 1024
PROBE_TIMEOUT_S = 2.0
# Defaults of the config's limits; the unit's TasksMax= and LimitNOFILE= leave room for MAX_CONNECTIONS.
MAX_CONNECTIONS = 1024
HEADER_TIMEOUT_S = 5.0
IDLE_TIMEOUT_S = 15.0
HEALTH = "/health"
# The allowed endpoints and their methods; see the module's docstring for where they come from.
ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/models": ("GET",),
}
# Headers of the client's request that reach the upstream; the rest (Host, Accept-Encoding, hop-by-hop
# headers) are the gateway's own business with each side.
FORWARDED = ("Content-Type", "Accept")


@dataclass(frozen=True)
class Upstream:
    scheme: str
    host: str
    port: int | None
    prefix: str

    @classmethod
    def parse(cls, url: str, where: str) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{where} must be an http:// or https:// URL, got {url!r}")
        if parts.username is not None or parts.query or parts.fragment or url.endswith(("?", "#")):
            raise ValueError(f"{where} must hold no user, query or fragment, got {url!r}")
        prefix = parts.path.rstrip("/")
        if prefix:
            try:
                request_path(prefix, "path")
            except Refused as exc:
                raise ValueError(f"{where}: {exc}") from None
        return cls(parts.scheme, parts.hostname, parts.port, prefix)

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def target(self, path: str) -> str:
        """The request target upstream: the URL's own path prefix, then an allowed path."""
        return self.prefix + path

    def connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass(frozen=True)
class Config:
    bind: str
    port: int
    backend: Upstream
    fallback: Upstream | None
    fallback_model: str | None
    served_name: str
    health_every_s: float
    timeout_s: float
    max_connections: int
    header_timeout_s: float
    idle_timeout_s: float

    @classmethod
    def load(cls, path: str) -> Config:
        try:
            with open(path, encoding="utf-8") as f:
                raw: dict[str, Any] = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read the config: {exc}") from exc
        try:
            fallback = raw.get("fallback")
            if fallback is not None and (not isinstance(fallback, dict) or not fallback.get("model")):
                raise ValueError('fallback must be null or {"url": ..., "model": ...}')
            config = cls(
                bind=str(raw["bind"]),
                port=int(raw["port"]),
                backend=Upstream.parse(str(raw["backend"]), "backend"),
                fallback=Upstream.parse(str(fallback.get("url")), "fallback.url") if fallback else None,
                fallback_model=str(fallback["model"]) if fallback else None,
                served_name=str(raw["served_name"]),
                health_every_s=float(raw.get("health_every_s", 2.0)),
                timeout_s=float(raw.get("timeout_s", 600)),
                max_connections=int(raw.get("max_connections", MAX_CONNECTIONS)),
                header_timeout_s=float(raw.get("header_timeout_s", HEADER_TIMEOUT_S)),
                idle_timeout_s=float(raw.get("idle_timeout_s", IDLE_TIMEOUT_S)),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: {exc.args[0]} is required") from exc
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        if config.max_connections < 1 or min(config.header_timeout_s, config.idle_timeout_s) <= 0:
            raise ValueError(f"{path}: max_connections, header_timeout_s and idle_timeout_s must be positive")
        return config


class Health:
    """The backend's health, probed at most every ``every_s`` whichever thread asks."""

    def __init__(self, backend: Upstream, every_s: float) -> None:
        self.backend = backend
        self.every_s = every_s
        self.mutex = threading.Lock()
        self.checked = float("-inf")
        self.ok: bool | None = None

    def healthy(self) -> bool:
        # The probe runs under the lock: concurrent requests wait for its answer rather than probe too.
        with self.mutex:
            if time.monotonic() - self.checked >= self.every_s:
                ok, why = self._probe()
                self.checked = time.monotonic()
                if ok != self.ok:
                    print("backend healthy" if ok else f"backend unhealthy: {why}", file=sys.stderr)
                self.ok = ok
            return bool(self.ok)

    def forget(self) -> None:
        """Probe again on the next request (the backend just failed one)."""
        with self.mutex:
            self.checked = float("-inf")

    def _probe(self) -> tuple[bool, str]:
        conn = self.backend.connect(PROBE_TIMEOUT_S)
        try:
            conn.request("GET", self.backend.target(HEALTH), headers={"Host": self.backend.netloc})
            answer = conn.getresponse()
            answer.read(CHUNK)
            return answer.status == 200, f"/health answered {answer.status}"
        except (OSError, http.client.HTTPException) as exc:
            return False, f"/health: {exc.__class__.__name__}: {exc}"
        finally:
            conn.close()


class Gateway:
    def __init__(self, config: Config, client_key: str, fallback_key: str | None) -> None:
        self.config = config
        self.client_key = client_key.encode()
        self.fallback_key = fallback_key
        self.health = Health(config.backend, config.health_every_s)

    def authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode("latin-1"), self.client_key)

    def rewrite_model(self, doc: dict[str, Any], body: bytes) -> bytes:
        """The body for the hosted API: the served name becomes the hosted model, nothing else changes."""
        if doc.get("model") != self.config.served_name:
            return body
        return json.dumps({**doc, "model": self.config.fallback_model}).encode()


def _error(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


_BUSY = _error("too many connections: try again shortly", "unavailable")
BUSY_ANSWER = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(_BUSY), _BUSY)
)


def handler(gw: Gateway) -> type[BaseHTTPRequestHandler]:
    config = gw.config

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kimi-gateway"
        timeout = None  # each phase sets its own: the head's deadlines, then timeout_s upstream

        served = 0
        body_pending = False

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            return  # request lines are not logged; fallback requests and health changes are

        def _answer(self, code: int, body: bytes, close: bool = False, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            # A body left unread would be taken for the next request, and a HEAD client reads no
            # body: the connection ends here.
            if close or self.body_pending or self.command == "HEAD":
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def handle_one_request(self) -> None:
            self.close_connection = True
            self.command, self.path, self.request_version, self.body_pending = "", "", "HTTP/1.1", False
            # A new connection has header_timeout_s to start its request, a kept-alive one idle_timeout_s.
            wait = config.idle_timeout_s if self.served else config.header_timeout_s
            try:
                try:
                    head = read_head(
                        self.connection, cast(io.BufferedReader, self.rfile), wait, config.header_timeout_s
                    )
                except Refused as exc:
                    # The head itself is wrong: where the next request would start is unknown.
                    self._answer(exc.status, _error(str(exc), "invalid_request_error"), close=True)
                    return
                if head is None:
                    return
                self.served += 1
                self.command, self.path, self.request_version = head.method, head.target, head.version
                self.close_connection = not head.keep_alive
                self.body_pending = head.has_body
                self.connection.settimeout(config.timeout_s)
                try:
                    self._handle(head)
                except Refused as exc:
                    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
                    extra = {"Allow": ", ".join(ROUTES.get(self.path, ()))} if exc.status == 405 else None
                    self._answer(exc.status, _error(str(exc), kind), extra=extra)
                self.wfile.flush()
            except OSError:
                self.close_connection = True  # the client left or stalled: nobody to answer

        def _handle(self, head: Head) -> None:
            path, query = request_path(head.target)
            self.path = path  # the checked path: all that is logged or sent upstream
            if query is not None:
                raise Refused(400, "query strings are not served: none of the endpoints takes one")
            if path == HEALTH and head.method == "GET":
                if head.has_body:
                    raise Refused(400, "GET /health takes no body")
                backend, has_fallback = gw.health.healthy(), config.fallback is not None
                code = 200 if backend or has_fallback else 503
                self._answer(code, json.dumps({"backend": backend, "fallback": has_fallback}).encode())
                return
            # Refused requests close the connection instead of reading a body nobody asked for.
            if not gw.authorized(head.get("authorization")):
                self._answer(401, _error("missing or wrong API key", "invalid_request_error"), close=True,
                             extra={"WWW-Authenticate": "Bearer"})  # fmt: skip
                return
            methods = ROUTES.get(path)
            if methods is None:
                raise Refused(404, f"{shown(path)} is not served here: only {', '.join(ROUTES)}")
            if head.method not in methods:
                raise Refused(405, f"{path} takes {' or '.join(methods)}, not {head.method}")
            body, doc = self._read_body(head)
            if gw.health.healthy():
                headers = self._forwarded(head)
                headers["Authorization"] = head.get("authorization") or ""
                if self._proxy(config.backend, path, body, headers):
                    return
                gw.health.forget()
                self._answer(502, _error("the local backend failed to answer", "upstream_error"))
                return
            fallback = config.fallback
            if fallback is None:
                self._answer(503, _error("the local backend is unhealthy and no fallback is configured", "unavailable"))
                return
            print(f"fallback: {head.method} {path} -> {fallback.netloc} (backend unhealthy)", file=sys.stderr)
            headers = self._forwarded(head)
            headers["Authorization"] = f"Bearer {gw.fallback_key}"
            if doc is not None:
                body = gw.rewrite_model(doc, body)
            if not self._proxy(fallback, path, body, headers):
                self._answer(502, _error("the fallback API failed to answer", "upstream_error"))

        def _read_body(self, head: Head) -> tuple[bytes, dict[str, Any] | None]:
            """The request's body and, for a POST, the JSON object it holds; ``Refused`` otherwise."""
            if head.method == "GET":
                if head.has_body:
                    raise Refused(400, f"GET {self.path} takes no body")
                return b"", None
            if head.get("transfer-encoding") is not None:
                raise Refused(411, "send the body with a Content-Length")
            length = head.content_length
            if length > MAX_BODY:
                raise Refused(413, f"request body over {MAX_BODY} bytes")
            expect = head.get("expect")
            if expect is not None:
                if expect.lower() != "100-continue" or head.version != "HTTP/1.1":
                    raise Refused(417, f"Expect: {expect[:40]!r} is not served")
                self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self.rfile.read(length)
            if len(body) != length:
                raise ConnectionResetError("the client left mid-body")
            self.body_pending = False
            try:
                doc = loads(body, "request body", MAX_BODY, MAX_DEPTH)
            except ValueError as exc:
                raise Refused(400, str(exc)) from None
            if not isinstance(doc, dict):
                raise Refused(400, "request body: must be a JSON object")
            return body, doc

        def _forwarded(self, head: Head) -> dict[str, str]:
            return {name: value for name in FORWARDED if (value := head.get(name)) is not None}

        def _proxy(self, upstream: Upstream, path: str, body: bytes, headers: dict[str, str]) -> bool:
            """Pass the request on and stream the answer back; False when nothing could be answered."""
            # Host is the upstream's, and the target is its prefix and an allowed path: nothing the
            # client sent decides where the request goes.
            headers["Host"] = upstream.netloc
            conn = upstream.connect(config.timeout_s)
            try:
                try:
                    if body or self.command == "POST":
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, upstream.target(path), body=body or None, headers=headers)
                    answer = conn.getresponse()
                except (OSError, http.client.HTTPException) as exc:
                    print(f"{upstream.netloc}: {self.command} {path}: {exc.__class__.__name__}: {exc}", file=sys.stderr)
                    return False
                self._relay(answer)
                return True
            finally:
                conn.close()

        def _relay(self, answer: http.client.HTTPResponse) -> None:
            self.send_response(answer.status, answer.reason)
            content_type = answer.getheader("Content-Type")
            if content_type:
                self.send_header("Content-Type", content_type)
            if answer.status in (204, 304):
                self.end_headers()
                return
            length = answer.getheader("Content-Length") if answer.getheader("Transfer-Encoding") is None else None
            chunked = length is None and self.request_version != "HTTP/1.0"
            if length is not None:
                self.send_header("Content-Length", length)
            elif chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            try:
                while True:
                    # read1: what has arrived, without waiting for a full buffer (SSE events are small).
                    data = answer.read1(CHUNK)
                    if not data:
                        break
                    if chunked:
                        self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
                    else:
                        self.wfile.write(data)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            except (OSError, http.client.HTTPException) as exc:
                # Mid-answer: the status is sent, so the client learns of it from a cut-off body.
                print(f"{self.command} {self.path}: answer cut off: {exc.__class__.__name__}", file=sys.stderr)
                self.close_connection = True

    return Handler


class Server(BoundedThreads, HTTPServer):
    """One thread per connection, at most ``max_connections`` at once; beyond, 503 and close."""

    request_queue_size = 128

    def __init__(self, config: Config, gw: Gateway) -> None:
        self.slots = threading.BoundedSemaphore(config.max_connections)
        super().__init__((config.bind, config.port), handler(gw))

    def refuse(self, request: socket.socket, client_address: Any) -> None:
        try:
            request.setblocking(False)
            request.send(BUSY_ANSWER)
        except OSError:
            pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # One line, never a traceback (a traceback shows local values' reprs).
        exc = sys.exc_info()[1]
        print(f"{client_address[0]}: connection ended: {exc.__class__.__name__}", file=sys.stderr)


def _notify(message: str) -> None:
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return
    address = "\0" + where[1:] if where.startswith("@") else where
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), address)


def main() -> None:
    parser = argparse.ArgumentParser(description="The cluster's API gateway, with the hosted API as fallback.")
    parser.add_argument("--config", required=True, help="the gateway's JSON config")
    args = parser.parse_args()
    try:
        config = Config.load(args.config)
    except ValueError as exc:
        sys.exit(str(exc))
    client_key = os.environ.get("KIMI_API_KEY", "").strip()
    if not client_key:
        sys.exit("KIMI_API_KEY is not set: clients could not be told apart from anyone else")
    fallback_key = os.environ.get("KIMI_FALLBACK_API_KEY", "").strip() or None
    if config.fallback is not None and fallback_key is None:
        sys.exit(f"{args.config}: a fallback is configured but KIMI_FALLBACK_API_KEY is not set")
    try:
        check_key("KIMI_API_KEY", client_key)
        if fallback_key is not None:
            check_key("KIMI_FALLBACK_API_KEY", fallback_key)
    except ValueError as exc:
        sys.exit(str(exc))
    gw = Gateway(config, client_key, fallback_key)
    try:
        server = Server(config, gw)
    except OSError as exc:
        sys.exit(f"{config.bind}:{config.port}: cannot listen: {exc.strerror or exc}")
    _notify("READY=1")
    where = f"fallback {config.fallback.netloc}" if config.fallback else "no fallback"
    print(f"serving on {config.bind}:{config.port}: backend {config.backend.netloc}, {where}", file=sys.stderr)
    server.serve_forever()


if __name__ == "__main__":
    main()
