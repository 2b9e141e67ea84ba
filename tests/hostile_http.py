"""Whatever may listen on an engine's port, on loopback: a socket-level server that answers each
request with the raw bytes a test sets for its path (well-formed HTTP or not), and can keep a body
going for as long as the client reads.

The hostile answers below are what a host program meets when something other than the engine
answers (another service on the port, a broken or compromised engine, a proxy gone wrong).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# Another service on the port: no HTTP status line at all.
NOT_HTTP = b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"
# A status line whose code is no number.
BAD_STATUS = b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n"
# A header line longer than any HTTP client reads.
LONG_LINE = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 100_000 + b"\r\nContent-Length: 0\r\n\r\n"
# More headers than an HTTP client takes.
MANY_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: a\r\n" * 200 + b"Content-Length: 0\r\n\r\n"
# A body that says it is long, and arrives a little at a time, for ever.
ENDLESS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"


def unanswered(path: str, endless_said: str) -> pytest.MarkDecorator:
    """``pytest.mark.parametrize`` over ``(sent, endless, said)``: each hostile head above as the
    answer, and ENDLESS as ``path``'s, with the words a reader's one line holds for each."""
    return pytest.mark.parametrize(
        ("sent", "endless", "said"),
        [
            (NOT_HTTP, (), "not HTTP: status line 'SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13'"),
            (BAD_STATUS, (), "not HTTP: status line 'HTTP/1.1 2OO OK'"),
            (LONG_LINE, (), "not HTTP: a header line over 65536 bytes"),
            (MANY_HEADERS, (), "not HTTP: more than 100 headers"),
            (ENDLESS, (path,), endless_said),
        ],
        ids=["not-http", "bad-status", "long-line", "many-headers", "endless-body"],
    )


def answer(body: bytes | Any, status: int = 200, kind: str = "application/json") -> bytes:
    """A well-formed HTTP/1.1 answer of ``body`` (bytes, or a value sent as JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    return head.encode() + data


# 300 KB of JSON nested 150,000 levels deep, as a canary's answer.
NESTED = answer(b"[" * 150_000 + b"]" * 150_000)


class Hostile:
    """Listens on 127.0.0.1 until ``close``; each request gets ``answers[path]`` (``default`` for
    a path not listed), then, for a path in ``endless``, a byte every 50 ms until the client
    leaves. ``asked`` holds the paths asked, in order."""

    def __init__(
        self, answers: dict[str, bytes] | None = None, default: bytes = BAD_STATUS, endless: tuple[str, ...] = ()
    ) -> None:
        self.answers, self.default, self.endless = dict(answers or {}), default, endless
        self.asked: list[str] = []
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()

    def __enter__(self) -> Hostile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                received = b""
                while b"\r\n\r\n" not in received and len(received) < 1 << 16:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        return
                    received += chunk
                head, _, body = received.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1] if len(lines[0].split(" ")) == 3 else ""
                length = next(
                    (
                        int(v)
                        for k, _, v in (h.partition(":") for h in lines[1:])
                        if k.strip().lower() == "content-length"
                    ),
                    0,
                )
                while len(body) < length:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        return
                    body += chunk
                self.asked.append(path)
                conn.sendall(self.answers.get(path, self.default))
                while path in self.endless and not self.closed.wait(0.05):
                    conn.sendall(b" ")
            except OSError:
                return


def within(seconds: float, work: Callable[[], T]) -> T:
    """``work()``'s result, or a failed test when it is still running after ``seconds`` (it is
    left to finish in a daemon thread): what proves a reader ends instead of hanging."""
    done: list[T] = []
    failed: list[Exception] = []

    def run() -> None:
        try:
            done.append(work())
        except Exception as exc:  # noqa: BLE001 - handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"still running after {seconds:g} s")
    if failed:
        raise failed[0]
    return done[0]
