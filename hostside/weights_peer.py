"""Serve a revision's verified files to the other hosts of a run: download once, fan out.

Run as a transient systemd service (``Type=notify``, the engine user, read-only), started before
the other hosts fetch and stopped after. Input: one argument, base64 of zlib-compressed JSON:
{"dir", "lock": {path: [size, digest]}, "bind", "port", "key_file", "allow": [address],
"idle_exit_s"}: only the hosts of the run (``allow``) are answered.

``GET /<path>`` with ``Authorization: Bearer <key>`` answers the file when the lock names it and the
revision's verification cache holds it verified with the lock's digest, unchanged since (size,
mtime, inode). Anything else: 401 without the key, 404 otherwise. A file is never served from a
host that has not verified it, and the receiver verifies what it receives again.

Tells systemd READY=1 once listening; exits after ``idle_exit_s`` without a request in flight.
One journal line per file served.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote


class Peer:
    def __init__(self, req: dict[str, Any]) -> None:
        self.root: str = req["dir"]
        self.lock: dict[str, list[Any]] = req["lock"]
        with open(req["key_file"], encoding="utf-8") as f:
            self.key = f.read().strip().encode()
        try:
            with open(os.path.join(self.root, ".kimi", "verify-cache.json"), encoding="utf-8") as f:
                self.cache: dict[str, list[Any]] = json.load(f)
        except (OSError, ValueError):
            self.cache = {}
        self.allow = set(req.get("allow") or [])
        self.idle_exit_s = float(req.get("idle_exit_s", 300))
        self.busy = 0
        self.last = time.monotonic()
        self.mutex = threading.Lock()
        self.served = 0

    def verified(self, rel: str) -> str | None:
        """The file's path when it may be served, else None."""
        if rel not in self.lock:
            return None
        size, digest = self.lock[rel]
        path = os.path.join(self.root, rel)
        try:
            st = os.stat(path)
        except OSError:
            return None
        if st.st_size != size or self.cache.get(rel) != [st.st_size, st.st_mtime_ns, st.st_ino, digest]:
            return None
        return path

    def authorized(self, header: str | None) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), self.key)

    def activity(self, delta: int) -> None:
        with self.mutex:
            self.busy += delta
            self.last = time.monotonic()

    def idle(self) -> bool:
        with self.mutex:
            return self.busy == 0 and time.monotonic() - self.last > self.idle_exit_s


def handler(peer: Peer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kimi-weights-peer"

        def log_message(self, format: str, *args: Any) -> None:
            return  # one line per file served is logged below, nothing per request

        def _refuse(self, code: int) -> None:
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            peer.activity(+1)
            try:
                if self.client_address[0] not in peer.allow or not peer.authorized(self.headers.get("Authorization")):
                    self._refuse(401)
                    return
                rel = unquote(self.path.lstrip("/"))
                path = peer.verified(rel)
                if path is None:
                    self._refuse(404)
                    return
                started = time.monotonic()
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    self.send_response(200)
                    self.send_header("Content-Length", str(size))
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    self.connection.sendfile(f)
                with peer.mutex:
                    peer.served += size
                seconds = time.monotonic() - started
                print(f"served {rel} ({size} bytes) to {self.client_address[0]} in {seconds:.2f} s", file=sys.stderr)
            except OSError:
                self.close_connection = True
            finally:
                peer.activity(-1)

    return Handler


def _notify(message: str) -> None:
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return
    address = "\0" + where[1:] if where.startswith("@") else where
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), address)


def main() -> None:
    req = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
    peer = Peer(req)
    server = ThreadingHTTPServer((req["bind"], int(req["port"])), handler(peer))
    server.daemon_threads = True

    def watch() -> None:
        while not peer.idle():
            time.sleep(1)
        print(f"idle for {peer.idle_exit_s:.0f} s: stopping", file=sys.stderr)
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    _notify("READY=1")
    print(f"serving {len(peer.cache)} verified files of {peer.root} on {req['bind']}:{req['port']}", file=sys.stderr)
    server.serve_forever()
    print(f"served {peer.served} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
