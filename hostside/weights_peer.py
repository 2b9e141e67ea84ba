"""Serve a revision's verified files to the other hosts of a run: download once, fan out.

Run as a transient systemd service (``Type=notify``, the engine user, read-only), started before
the other hosts fetch and stopped after. Input: one argument, base64 of zlib-compressed JSON:
{"dir", "lock": {path: [size, digest]}, "bind", "port", "key_file", "allow": [address],
"idle_exit_s"}: only the hosts of the run (``allow``) are answered.

``GET /<path>`` with ``Authorization: Bearer <key>`` answers the file when the lock names it, its
path stays inside ``dir`` (``hostside.boundary_names``), and the revision's verification cache holds
it verified with the lock's digest, unchanged since (size, mtime, inode). Anything else: 401 without
the key, 404 for a file it may not serve, 400/408/431 for a head that breaks ``boundary_http``'s
rules. A file is never served from a host that has not verified it, and the receiver verifies what
it receives again.

What a client can make it spend is bounded before it is known: a connection from an address
outside ``allow`` is closed before a byte is read, and so is one beyond ``MAX_CONNECTIONS``, told
only ``503`` with ``Retry-After`` (the fetcher waits its turn, see weights_sync.py); one
request per connection, whose head (``hostside.boundary_http.read_head``: small size and header
limits) must start within ``WAIT_S`` and be whole ``HEAD_S`` later, and carry the key before
anything else is looked at; a reader that takes nothing for ``SEND_STALL_S`` is dropped.

Tells systemd READY=1 once listening; exits after ``idle_exit_s`` without a request in flight.
One journal line per file served, and one at exit counting the connections refused.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import os
import socket
import socketserver
import sys
import threading
import time
import zlib
from collections import Counter
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from hostside.boundary_http import BoundedThreads, Refused, read_head
from hostside.boundary_names import BadName, check_names, inside
from hostside.sd_notify import notify

MAX_CONNECTIONS = 32
WAIT_S = 5.0
HEAD_S = 5.0
SEND_STALL_S = 60.0
CACHE_BYTES = 16 << 20  # the verification cache of a revision is a few KiB per hundred files
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Peer:
    def __init__(self, req: dict[str, Any]) -> None:
        self.root: str = req["dir"]
        self.lock: dict[str, list[Any]] = req["lock"]
        check_names(self.lock)
        with open(req["key_file"], encoding="utf-8") as f:
            self.key = f.read().strip().encode()
        if not self.key:
            raise ValueError(f"{req['key_file']}: the transfer key is empty")
        self.cache = _load_cache(self.root)
        self.allow = set(req.get("allow") or [])
        self.idle_exit_s = float(req.get("idle_exit_s", 300))
        self.busy = 0
        self.last = time.monotonic()
        self.mutex = threading.Lock()
        self.served = 0
        self.refused: Counter[str] = Counter()

    def verified(self, rel: str) -> str | None:
        """The file's path when it may be served, else None."""
        if rel not in self.lock:
            return None
        size, digest = self.lock[rel]
        try:
            path = inside(self.root, rel)
            st = os.stat(path)
        except (OSError, BadName):
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

    def count(self, why: str) -> None:
        with self.mutex:
            self.refused[why] += 1


def _load_cache(root: str) -> dict[str, list[Any]]:
    """The revision's verification cache (``{path: [size, mtime_ns, inode, digest]}``), bounded; empty if unusable."""
    try:
        with open(os.path.join(root, ".kimi", "verify-cache.json"), "rb") as f:
            data = json.loads(f.read(CACHE_BYTES + 1)) if os.fstat(f.fileno()).st_size <= CACHE_BYTES else None
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


class Handler(socketserver.BaseRequestHandler):
    server: Server

    def handle(self) -> None:
        peer, client = self.server.peer, self.client_address[0]
        peer.activity(+1)
        try:
            with self.request.makefile("rb") as stream:
                head = read_head(self.request, stream, WAIT_S, HEAD_S)
            if head is None:
                return  # nothing asked in time, or the client left
            if not peer.authorized(head.get("authorization")):
                peer.count("requests without the key")
                raise Refused(401, "no key")
            if head.method != "GET" or head.has_body or not head.target.startswith("/"):
                raise Refused(400, "only GET /<file>")
            # The lock is the allow-list: its names are checked (no '..', no leading '/').
            try:
                rel = unquote(head.target[1:], errors="strict")
            except UnicodeDecodeError:
                raise Refused(404, "no such file") from None
            path = peer.verified(rel)
            if path is None:
                raise Refused(404, "no such file")
            self._send(path, rel, client)
        except Refused as refused:
            with contextlib.suppress(OSError):
                self._status(refused.status, 0)
        except OSError:
            pass  # the client went away or stopped reading: nothing more to tell it
        finally:
            peer.activity(-1)

    def _status(self, code: int, length: int, extra: str = "") -> None:
        status = f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
        head = f"{status}Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n"
        self.request.settimeout(SEND_STALL_S)
        self.request.sendall(head.encode("ascii"))

    def _send(self, path: str, rel: str, client: str) -> None:
        peer = self.server.peer
        started = time.monotonic()
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._status(200, size, "Content-Type: application/octet-stream\r\n")
            # With a timeout set, sendfile gives up on a reader that takes nothing for that long.
            self.request.sendfile(f)
        with peer.mutex:
            peer.served += size
        seconds = time.monotonic() - started
        print(f"served {rel} ({size} bytes) to {client} in {seconds:.2f} s", file=sys.stderr)


class Server(BoundedThreads, socketserver.TCPServer):
    """One thread per connection, at most ``MAX_CONNECTIONS`` of them, from the run's hosts only."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, peer: Peer, address: tuple[str, int]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.peer = peer
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # Decided on the address alone, before a byte is read: refused connections are just closed.
        if client_address[0] not in self.peer.allow:
            self.peer.count("from outside the run")
            return False
        return True

    def refuse(self, request: socket.socket, client_address: Any) -> None:
        self.peer.count(f"over {MAX_CONNECTIONS} at once")
        # Busy, as HTTP says it (RFC 9110 15.6.4): the fetcher waits its turn rather than going
        # to the Hub. Sent unread, in one small write that cannot block the accepting thread.
        with contextlib.suppress(OSError):
            request.setblocking(False)
            request.send(BUSY)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        print(f"connection from {client_address[0]}: {type(exc).__name__}: {exc}", file=sys.stderr)


def main() -> None:
    req = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
    try:
        peer = Peer(req)
    except (BadName, ValueError, OSError) as exc:
        print(f"kimi-deploy: weights peer {req.get('dir')}: {exc}", file=sys.stderr)
        sys.exit(6)
    server = Server(peer, (req["bind"], int(req["port"])))

    def watch() -> None:
        while not peer.idle():
            time.sleep(1)
        print(f"idle for {peer.idle_exit_s:.0f} s: stopping", file=sys.stderr)
        server.shutdown()

    threading.Thread(target=watch, daemon=True).start()
    notify("READY=1")
    print(f"serving {len(peer.cache)} verified files of {peer.root} on {req['bind']}:{req['port']}", file=sys.stderr)
    server.serve_forever()
    refused = ", ".join(f"{n} {why}" for why, n in sorted(peer.refused.items()))
    print(f"served {peer.served} bytes; refused {refused or 'nothing'}", file=sys.stderr)


if __name__ == "__main__":
    main()
