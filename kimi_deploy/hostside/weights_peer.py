"""Serve a revision's verified files to the other hosts of a run: download once, fan out.

Run as a transient systemd service (``Type=notify``, the engine user, read-only), started before
the other hosts fetch and stopped after. Input: one argument, base64 of zlib-compressed JSON:
{"dir", "lock": {path: [size, digest]}, "bind", "port", "key_file", "allow": [address],
"idle_exit_s"}: only the hosts of the run (``allow``) are answered.

``GET /<path>`` with ``Authorization: Bearer <key>`` answers the file when the lock names it, its
path stays inside ``dir`` (``hostside.boundary_names``), and the revision's verification cache holds
it verified with the lock's digest, unchanged since (size, mtime, inode). With ``"fetching": true``
(this host's own sync runs in the same run) it also relays a file while it arrives: it sends the
bytes of the partial file as they are written and holds back the last one until the sync has
moved the whole file into place verified against the lock; a file the sync drops (a mismatch, a
source that failed) ends the answer short, so the receiver never has a whole file this host did not
verify, and verifies what it receives again. A file not there yet is waited for up to ``HOLD_S``,
then answered ``503`` with ``Retry-After`` (not yet) while the sync works or has still to start
(``PENDING_S`` after this service started; ``Peer.arriving``); anything else: 401 without
the key, 404 for a file it may not serve, 400/408/431 for a head that breaks ``boundary_http``'s
rules.

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

import contextlib
import hmac
import itertools
import os
import socket
import socketserver
import sys
import threading
import time
from collections import Counter
from http import HTTPStatus
from typing import Any, BinaryIO
from urllib.parse import unquote

from kimi_deploy.hostside.boundary_http import BoundedThreads, Refused, read_head
from kimi_deploy.hostside.boundary_names import BadName, check_names, inside
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.revision_files import CACHE, load_cache, meta, partial_path
from kimi_deploy.hostside.sd_notify import notify

MAX_CONNECTIONS = 32
WAIT_S = 5.0
HEAD_S = 5.0
SEND_STALL_S = 60.0
# A file not there yet is waited for this long before "not yet" (503), looking every WAIT_POLL_S;
# a relay looks for more of its file every POLL_S.
HOLD_S = 20.0
WAIT_POLL_S = 0.05
POLL_S = 0.02
# How long after it started this service still expects its host's sync to begin.
PENDING_S = 60.0
# A file's times come from the kernel's coarse clock, up to a tick (1 to 10 ms) behind
# time.time_ns(): a sync that began just after this service started can read as begun before.
MTIME_SLACK_NS = 50_000_000
BUSY = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Gone(Exception):
    """The file being relayed was dropped by this host's sync: the answer ends short."""


class Peer:
    def __init__(self, req: dict[str, Any]) -> None:
        self.root: str = req["dir"]
        self.lock: dict[str, list[Any]] = req["lock"]
        check_names(self.lock)
        with open(req["key_file"], encoding="utf-8") as f:
            self.key = f.read().strip().encode()
        if not self.key:
            raise ValueError(f"{req['key_file']}: the transfer key is empty")
        self.fetching = bool(req.get("fetching"))
        self.started_ns = time.time_ns()
        self.cache: dict[str, list[Any]] = {}
        self.cache_seen: tuple[int, int] | None = None
        self.refresh()
        self.allow = set(req.get("allow") or [])
        self.idle_exit_s = float(req.get("idle_exit_s", 300))
        self.busy = 0
        self.last = time.monotonic()
        self.mutex = threading.Lock()
        self.served = 0
        self.relayed = 0
        self.refused: Counter[str] = Counter()

    def refresh(self) -> None:
        """Read the verification cache again if the sync saved it since."""
        try:
            st = os.stat(meta(self.root, CACHE))
        except OSError:
            return
        if (st.st_mtime_ns, st.st_ino) != self.cache_seen:
            self.cache_seen = (st.st_mtime_ns, st.st_ino)
            self.cache = load_cache(self.root)

    def verified(self, rel: str, inode: int | None = None) -> str | None:
        """The file's path when it may be served (and, given ``inode``, is that file), else None."""
        size, digest = self.lock[rel]
        try:
            path = inside(self.root, rel)
            st = os.stat(path)
        except (OSError, BadName):
            return None
        if inode is not None and st.st_ino != inode:
            return None
        if st.st_size != size:
            return None
        key = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
        if self.cache.get(rel) != key:
            self.refresh()
            if self.cache.get(rel) != key:
                return None
        return path

    def arriving(self) -> bool:
        """Whether this host's own sync may still bring files: one began since this service
        started and has not ended (``sync-started`` and ``synced``, which the sync touches), or
        none has begun yet and this service started less than ``PENDING_S`` ago. Read from the
        markers' times, never by taking the sync's lock: readers polling a lock starve its writer."""
        if not self.fetching:
            return False
        began, ended = _touched(meta(self.root, "sync-started")), _touched(meta(self.root, "synced"))
        if began is not None and began >= self.started_ns - MTIME_SLACK_NS:
            return ended is None or ended < began
        return time.time_ns() - self.started_ns < PENDING_S * 1e9

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


def _touched(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _open_partial(root: str, rel: str) -> BinaryIO | None:
    try:
        return open(partial_path(root, rel), "rb")
    except OSError:
        return None


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
            if rel not in peer.lock:
                raise Refused(404, "no such file")
            self._answer(rel, client)
        except Refused as refused:
            with contextlib.suppress(OSError):
                self._status(refused.status, 0, "Retry-After: 1\r\n" if refused.status == 503 else "")
        except (OSError, Gone):
            pass  # the client went away or stopped reading, or the file was dropped: the answer ends
        finally:
            peer.activity(-1)

    def _answer(self, rel: str, client: str) -> None:
        """The verified file; or, while this host's sync brings it, the file as it arrives."""
        peer = self.server.peer
        started = time.monotonic()
        for turn in itertools.count():
            partial = _open_partial(peer.root, rel)
            if partial is not None:
                with partial:
                    self._relay(partial, rel, client)
                return
            path = peer.verified(rel)
            if path is not None:
                self._send(path, rel, client)
                return
            # Whether more may come is read less often than whether it came (stats cost CPU
            # that a host's own sync and relays share).
            if turn % 10 == 0 and not peer.arriving():
                raise Refused(404, "no such file")
            if time.monotonic() - started >= HOLD_S:
                raise Refused(503, "not yet")
            time.sleep(WAIT_POLL_S)

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

    def _relay(self, partial: BinaryIO, rel: str, client: str) -> None:
        """Send ``partial`` as the sync writes it, all but its last byte; that one once the sync
        placed this very file (same inode) verified. ``Gone`` when the sync drops it, or when it
        grows by nothing for ``SEND_STALL_S``."""
        peer, started = self.server.peer, time.monotonic()
        size = int(peer.lock[rel][0])
        inode = os.fstat(partial.fileno()).st_ino
        self._status(200, size, "Content-Type: application/octet-stream\r\n")
        sent, moved = 0, time.monotonic()
        for idle in itertools.count():
            have = os.fstat(partial.fileno()).st_size
            if min(have, size - 1) > sent:
                sent += self.request.sendfile(partial, sent, min(have, size - 1) - sent)
                moved = time.monotonic()
                continue
            if have >= size and peer.verified(rel, inode) is not None:
                if size > sent:
                    self.request.sendfile(partial, sent, size - sent)
                break
            if idle % 10 == 0 and (not self._still_arriving(rel, inode) or time.monotonic() - moved > SEND_STALL_S):
                raise Gone(rel)
            time.sleep(POLL_S)
        with peer.mutex:
            peer.relayed += size
        seconds = time.monotonic() - started
        print(f"relayed {rel} ({size} bytes) to {client} in {seconds:.2f} s as it arrived", file=sys.stderr)

    def _still_arriving(self, rel: str, inode: int) -> bool:
        """The partial file is still the one relayed, or has just been moved into place."""
        root = self.server.peer.root
        for path in (partial_path(root, rel), inside(root, rel)):
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == inode:
                    return True
        return False


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
    req = read_request()
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
    print(
        f"served {peer.served} bytes, relayed {peer.relayed} as they arrived; refused {refused or 'nothing'}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
