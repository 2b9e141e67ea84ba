"""Stand-in ``vllm-router`` (packaged as ``vllm_router/launch_router.py``): a prefill/decode HTTP router.

With ``--vllm-pd-disaggregation`` each completion goes to a prefill engine first (``max_tokens`` 1)
and then to a decode engine, whose answer the client gets; ``--policy`` picks the engines (round
robin here, whatever the name). ``/health`` is 200 only while every engine's ``/health`` is, so a
readiness wait on the router waits for the engines behind it. Stdlib only.

Keys, as vllm-router 0.1.17 handles them (tests/localcluster/test_router_contract.py runs the real
wheel and this stand-in side by side and holds them to the same answers): it checks no client key;
``GET /v1/models`` reaches an engine with the client's ``Authorization`` header as it came; a
completion reaches the prefill and the decode engine with ``Authorization: Bearer
$OPENAI_API_KEY`` from the router's own environment, whatever the client sent.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash")
_FORWARD_TIMEOUT = 600.0
_HEALTH_TIMEOUT = 2.0


def _log(message: str, level: str = "INFO") -> None:
    sys.stderr.write(f"{level} {time.strftime('%m-%d %H:%M:%S')} [vllm-router] {message}\n")
    sys.stderr.flush()


def _call(
    url: str, method: str, path: str, body: bytes | None = None, *, headers: dict[str, str], timeout: float
) -> tuple[int, str, bytes]:
    """One request to an engine: (status, content type, body); status 0 when it cannot be reached."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", "application/json"), response.read()
    except OSError as exc:
        return 0, "application/json", json.dumps({"error": f"{url} unreachable: {exc}"}).encode()
    finally:
        conn.close()


class Router(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 resets connections when a whole cluster calls at once.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], prefill: list[str], decode: list[str]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.prefill = prefill
        self.decode = decode
        self._prefill_turns: Iterator[str] = itertools.cycle(prefill) if prefill else iter(())
        self._decode_turns: Iterator[str] = itertools.cycle(decode)
        self.lock = threading.Lock()
        self.counts: Counter[tuple[str, int]] = Counter()
        super().__init__(address, _Handler)

    def pick(self) -> tuple[str | None, str]:
        with self.lock:
            return next(self._prefill_turns, None), next(self._decode_turns)

    def healthy(self) -> list[str]:
        """The engines whose /health is not 200 right now."""
        engines = [*self.prefill, *self.decode]

        def status(url: str) -> int:
            return _call(url, "GET", "/health", headers={}, timeout=_HEALTH_TIMEOUT)[0]

        with ThreadPoolExecutor(max_workers=min(16, len(engines))) as pool:
            states = list(pool.map(status, engines))
        return [u for u, s in zip(engines, states, strict=True) if s != 200]


class _Handler(BaseHTTPRequestHandler):
    server: Router
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        _log(format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        with self.server.lock:
            self.server.counts[(urlsplit(self.path).path, status)] += 1
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _client_headers(self) -> dict[str, str]:
        """A model list's request: the client's Authorization header passed on as it came."""
        headers = {"Content-Type": "application/json"}
        if auth := self.headers.get("Authorization"):
            headers["Authorization"] = auth
        return headers

    def _engine_headers(self) -> dict[str, str]:
        """A completion's requests to the engines: the router's own key, never the client's."""
        return {"Content-Type": "application/json", "Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '')}"}

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/health":
            down = self.server.healthy()
            if down:
                self._send(503, json.dumps({"unhealthy": down}).encode())
            else:
                self._send(200, b"OK", "text/plain")
        elif path == "/v1/models":
            headers = self._client_headers()
            status, kind, body = _call(self.server.decode[0], "GET", path, headers=headers, timeout=_FORWARD_TIMEOUT)
            self._send(status or 502, body, kind)
        elif path == "/metrics":
            with self.server.lock:
                counts = sorted(self.server.counts.items())
            lines = [f'vllm_router_requests_total{{code="{c}",path="{p}"}} {n}' for (p, c), n in counts]
            self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._send(404, b'{"detail":"Not Found"}')
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            request = json.loads(raw)
        except ValueError:
            self._send(400, b'{"error":"request body is not JSON"}')
            return
        prefill, decode = self.server.pick()
        headers = self._engine_headers()
        if prefill is not None and isinstance(request, dict):
            # The prefill engine computes the KV cache; its one token is thrown away, as the real router does.
            first = json.dumps({**request, "max_tokens": 1, "stream": False}).encode()
            status, kind, body = _call(prefill, "POST", path, first, headers=headers, timeout=_FORWARD_TIMEOUT)
            if status != 200:
                self._send(status or 502, body, kind)
                return
        status, kind, body = _call(decode, "POST", path, raw, headers=headers, timeout=_FORWARD_TIMEOUT)
        self._send(status or 502, body, kind)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The router's options; argparse's usage error (exit 2) on what the real router would refuse."""
    parser = argparse.ArgumentParser(prog="vllm-router", description="Stand-in vllm-router (prefill/decode).")
    parser.add_argument("--vllm-pd-disaggregation", action="store_true")
    parser.add_argument("--kv-connector", choices=("nixl", "mooncake"))
    parser.add_argument("--prefill", action="append", default=[], metavar="URL")
    parser.add_argument("--decode", action="append", default=[], metavar="URL")
    parser.add_argument("--worker-urls", nargs="+", default=[], metavar="URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--policy", choices=POLICIES, default="round_robin")
    args = parser.parse_args(argv)
    if args.vllm_pd_disaggregation and not (args.prefill and args.decode):
        parser.error("--vllm-pd-disaggregation needs at least one --prefill and one --decode")
    decode = args.decode if args.vllm_pd_disaggregation else args.worker_urls
    if not decode:
        parser.error("name the engines: --worker-urls, or --vllm-pd-disaggregation with --prefill/--decode")
    if not args.vllm_pd_disaggregation:
        args.decode, args.prefill = args.worker_urls, []
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    prefill, decode = args.prefill, args.decode
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    version = metadata.version("vllm-router")
    _log(f"vllm-router {version} stand-in starting: prefill {prefill}, decode {decode}, policy {args.policy}")
    try:
        router = Router((args.host, args.port), prefill, decode)
    except OSError as exc:
        _log(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", "ERROR")
        sys.exit(1)
    threading.Thread(target=router.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    _log(f"ready: routing on http://{args.host}:{args.port}")
    while not stop.wait(0.5):
        pass
    _log("shutting down")
    router.shutdown()
    router.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
