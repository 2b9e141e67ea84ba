"""Answer the cluster's OpenAI-compatible API on the router host, with the hosted API as fallback.

Run as a systemd service (``Type=notify``) in front of the local router:
``kimi-gateway.py --config /etc/kimi/kimi-gateway.json``. The config is JSON:
{"bind", "port", "backend": "http://127.0.0.1:8009", "fallback": {"url", "model"} | null,
"served_name", "health_every_s" (default 2.0), "timeout_s" (default 600)}. Two secrets come from the
environment (a root-only EnvironmentFile): ``KIMI_API_KEY``, the key clients must present, and
``KIMI_FALLBACK_API_KEY``, the hosted API's key (required only with a fallback). A missing key or a
bad config stops the program before it listens, with one line naming the problem.

``GET /health`` needs no key: 200 while the backend's ``/health`` answers 200, 200 too while it does
not but a fallback is configured, else 503; the body is always {"backend": bool, "fallback": bool}.

Every other GET or POST needs ``Authorization: Bearer <KIMI_API_KEY>``, else 401. Then:
- backend healthy (its ``/health`` probed at most every ``health_every_s``): the request goes to the
  backend with path, method, body, Content-Type, Accept and Authorization unchanged;
- else with a fallback: it goes to ``fallback.url`` + path with the hosted key instead of the
  client's, and a JSON body's "model" equal to ``served_name`` becomes ``fallback.model``; one stderr
  line per request: ``fallback: POST /v1/chat/completions -> api.moonshot.ai (backend unhealthy)``;
- else 503.
The answer's status, Content-Type and body come back as the upstream sends them, streamed: with the
upstream's Content-Length when it gives one, else ``Transfer-Encoding: chunked`` (close-delimited for
HTTP/1.0 clients), each piece forwarded as it arrives, so ``stream: true`` events are not held back.
An upstream that cannot be reached gives 502; a body over 64 MiB 413. Errors are OpenAI-style JSON
{"error": {"message", "type"}}. Keys are never logged.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 64 * 1024 * 1024
CHUNK = 64 * 1024
PROBE_TIMEOUT_S = 2.0
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
        return cls(parts.scheme, parts.hostname, parts.port, parts.path.rstrip("/"))

    @property
    def netloc(self) -> str:
        return self.host if self.port is None else f"{self.host}:{self.port}"

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
            return cls(
                bind=str(raw["bind"]),
                port=int(raw["port"]),
                backend=Upstream.parse(str(raw["backend"]), "backend"),
                fallback=Upstream.parse(str(fallback.get("url")), "fallback.url") if fallback else None,
                fallback_model=str(fallback["model"]) if fallback else None,
                served_name=str(raw["served_name"]),
                health_every_s=float(raw.get("health_every_s", 2.0)),
                timeout_s=float(raw.get("timeout_s", 600)),
            )
        except KeyError as exc:
            raise ValueError(f"{path}: {exc.args[0]} is required") from exc
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc


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
            conn.request("GET", self.backend.prefix + "/health")
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
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), self.client_key)

    def rewrite_model(self, body: bytes) -> bytes:
        """The body for the hosted API: the served name becomes the hosted model, nothing else changes."""
        try:
            doc = json.loads(body)
        except ValueError:
            return body
        if not isinstance(doc, dict) or doc.get("model") != self.config.served_name:
            return body
        doc["model"] = self.config.fallback_model
        return json.dumps(doc).encode()


def _error(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


def handler(gw: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kimi-gateway"
        timeout = gw.config.timeout_s  # an idle or stalled client does not hold a thread forever

        def log_message(self, format: str, *args: Any) -> None:
            return  # request lines are not logged; fallback requests and health changes are

        def _answer(self, code: int, body: bytes, close: bool = False, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._handle()

        def do_POST(self) -> None:
            self._handle()

        def _handle(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health" and self.command == "GET":
                backend, has_fallback = gw.health.healthy(), gw.config.fallback is not None
                code = 200 if backend or has_fallback else 503
                self._answer(code, json.dumps({"backend": backend, "fallback": has_fallback}).encode())
                return
            # Refused requests close the connection instead of reading a body nobody asked for.
            if not gw.authorized(self.headers.get("Authorization")):
                self._answer(401, _error("missing or wrong API key", "invalid_request_error"), close=True,
                             extra={"WWW-Authenticate": "Bearer"})  # fmt: skip
                return
            body = self._read_body()
            if body is None:
                return
            if gw.health.healthy():
                headers = self._forwarded()
                headers["Authorization"] = self.headers["Authorization"]
                if self._proxy(gw.config.backend, body, headers):
                    return
                gw.health.forget()
                self._answer(502, _error("the local backend failed to answer", "upstream_error"))
                return
            fallback = gw.config.fallback
            if fallback is None:
                self._answer(503, _error("the local backend is unhealthy and no fallback is configured", "unavailable"))
                return
            print(f"fallback: {self.command} {path} -> {fallback.netloc} (backend unhealthy)", file=sys.stderr)
            headers = self._forwarded()
            headers["Authorization"] = f"Bearer {gw.fallback_key}"
            if not self._proxy(fallback, gw.rewrite_model(body), headers):
                self._answer(502, _error("the fallback API failed to answer", "upstream_error"))

        def _read_body(self) -> bytes | None:
            """The request's body, or None once the request has been refused."""
            if "Transfer-Encoding" in self.headers:
                self._answer(411, _error("send the body with a Content-Length", "invalid_request_error"), close=True)
                return None
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self._answer(400, _error("bad Content-Length", "invalid_request_error"), close=True)
                return None
            if length > MAX_BODY:
                self._answer(413, _error(f"request body over {MAX_BODY} bytes", "invalid_request_error"), close=True)
                return None
            body = self.rfile.read(length)
            if len(body) != length:
                self.close_connection = True
                return None
            return body

        def _forwarded(self) -> dict[str, str]:
            return {name: value for name in FORWARDED if (value := self.headers.get(name)) is not None}

        def _proxy(self, upstream: Upstream, body: bytes, headers: dict[str, str]) -> bool:
            """Pass the request on and stream the answer back; False when nothing could be answered."""
            conn = upstream.connect(gw.config.timeout_s)
            try:
                try:
                    if body or self.command == "POST":
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, upstream.prefix + self.path, body=body or None, headers=headers)
                    answer = conn.getresponse()
                except (OSError, http.client.HTTPException) as exc:
                    print(f"{upstream.netloc}: {self.command} {self.path.split('?', 1)[0]}: "
                          f"{exc.__class__.__name__}: {exc}", file=sys.stderr)  # fmt: skip
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
                print(f"{self.command} {self.path.split('?', 1)[0]}: answer cut off: {exc.__class__.__name__}",
                      file=sys.stderr)  # fmt: skip
                self.close_connection = True

    return Handler


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
    gw = Gateway(config, client_key, fallback_key)
    server = ThreadingHTTPServer((config.bind, config.port), handler(gw))
    server.daemon_threads = True
    _notify("READY=1")
    where = f"fallback {config.fallback.netloc}" if config.fallback else "no fallback"
    print(f"serving on {config.bind}:{config.port}: backend {config.backend.netloc}, {where}", file=sys.stderr)
    server.serve_forever()


if __name__ == "__main__":
    main()
