"""HTTP from outside, read within bounds: a client's request head, checked before anything acts on
it, and an answer a host program reads from an engine or a router.

The rules the host's one hand-written HTTP server (the weights peer) applies to what a client sends:

- ``read_head``: the request line and headers, read while counting (a line at most ``MAX_LINE``
  bytes, at most ``MAX_HEADERS`` headers, the whole head at most ``MAX_HEAD`` bytes) and against a
  clock (the first byte within ``wait_s``, the whole head within ``head_s``), so a client that
  sends slowly, sends nothing or sends a lot holds neither a thread nor memory for long.
- ``parse_head``: ``METHOD SP origin-form-target SP HTTP/1.0|HTTP/1.1``, header lines
  ``token ":" value`` with no control character and no obsolete line folding; ``Authorization``,
  ``Content-Length``, ``Content-Type``, ``Expect`` and ``Host`` at most once; a ``Content-Length``
  of digits only.

Every refusal is ``Refused``: the HTTP status to answer and one line naming the rule and what was
found (a value shown cut short, never a key).

What a host program asks of an engine or a router on a port of the plan (whatever listens there
answers: another service, a broken or compromised engine), through ``ask`` or ``answering``: one
connection, no redirect followed, no proxy, the whole exchange (connecting, sending, the status
line, the headers, the body) ended by one clock of ``timeout_s``, at most ``max_bytes`` of body
and ``ANSWER_HEAD`` of status line and headers read. Anything short of a whole HTTP/1.x answer
within those bounds (nothing listening, a status line that is not HTTP's, a line or a head too
long, too many headers, a body cut short, too long or too slow) is ``Unanswered``: one line that
names the peer and what went wrong, ``engine at 127.0.0.1:8000: not HTTP: status line 'SSH-2.0'``.
Any status is an answer (an error's body included); what the body means is the caller's to check
(JSON through ``hostside.boundary_json``). Stdlib only: the host programs run this code bundled.
"""

from __future__ import annotations

import functools
import http.client
import json
import re
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kimi_deploy.hostside.boundary_text import shown

MAX_LINE = 8 * 1024
MAX_HEADERS = 64
MAX_HEAD = 32 * 1024
VERSIONS = ("HTTP/1.0", "HTTP/1.1")
SINGLE = ("authorization", "content-length", "content-type", "expect", "host")

_METHOD = re.compile(r"[A-Z]{1,16}")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class Refused(ValueError):
    """A request refused before it reached anyone: ``status`` to answer, ``str()`` one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Peekable(Protocol):
    """What ``read_head`` reads from: a buffered socket file (``socket.makefile("rb")``)."""

    def peek(self, size: int = 0, /) -> bytes: ...

    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Head:
    """A request line and its headers; header names lower-case, in the order sent."""

    method: str
    target: str
    version: str
    fields: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        """The header's value (repeated headers joined with ", "), or None when absent."""
        values = [v for k, v in self.fields if k == name.lower()]
        return ", ".join(values) if values else None

    @property
    def content_length(self) -> int:
        value = self.get("content-length")
        return int(value) if value else 0

    @property
    def has_body(self) -> bool:
        return self.content_length > 0 or self.get("transfer-encoding") is not None

    @property
    def keep_alive(self) -> bool:
        tokens = {t.strip().lower() for t in (self.get("connection") or "").split(",")}
        return self.version == "HTTP/1.1" and "close" not in tokens


def parse_head(lines: list[bytes]) -> Head:
    """The head of ``lines`` (each ending in CRLF, the blank line left out), or ``Refused``."""
    if not lines:
        raise Refused(400, "empty request")
    request = lines[0][:-2].decode("latin-1")
    if _CONTROL.search(request):
        raise Refused(400, f"request line {shown(request)}: control character")
    words = request.split(" ")
    if len(words) != 3 or not _METHOD.fullmatch(words[0]):
        raise Refused(400, f"request line {shown(request)}: not METHOD SP TARGET SP VERSION")
    method, target, version = words
    if version not in VERSIONS:
        raise Refused(505, f"request line {shown(request)}: only {' and '.join(VERSIONS)} are served")
    fields: list[tuple[str, str]] = []
    for raw in lines[1:]:
        line = raw[:-2].decode("latin-1")
        if line[:1] in (" ", "\t"):
            raise Refused(400, f"header line {shown(line)}: folded header lines are refused")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise Refused(400, f"header line {shown(line)}: not NAME: VALUE")
        value = value.strip(" \t")
        if _CONTROL.search(value):
            raise Refused(400, f"header {name}: control character in its value")
        fields.append((name.lower(), value))
    for name in SINGLE:
        if sum(1 for k, _ in fields if k == name) > 1:
            raise Refused(400, f"header {name}: given more than once")
    head = Head(method, target, version, tuple(fields))
    length = head.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit() and len(length) <= 18):
        raise Refused(400, f"header content-length: {shown(length)} is not a number of bytes")
    return head


def read_head(sock: socket.socket, stream: Peekable, wait_s: float, head_s: float) -> Head | None:
    """The next request head on ``sock``, read from ``stream`` (its buffered reader).

    None when the client closed the connection or sent nothing within ``wait_s`` (nothing to
    answer). ``Refused`` (408) when the head is not complete ``head_s`` after its first byte, or
    when it breaks a limit or a rule of ``parse_head``. Reads no byte past the head's blank line.
    """
    deadline = time.monotonic() + wait_s
    lines: list[bytes] = []
    line = bytearray()
    total = 0
    while True:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            data = stream.peek(1)  # what is buffered, or one read from the socket
        except TimeoutError:
            if total == 0:
                return None
            raise Refused(408, f"request head not complete within {head_s:g} s") from None
        if not data:
            return None  # the client left: nobody to answer
        if total == 0:
            deadline = time.monotonic() + head_s
        end = data.find(b"\n")
        taken = stream.read(end + 1 if end >= 0 else len(data))
        line += taken
        total += len(taken)
        if total > MAX_HEAD:
            raise Refused(431, f"request head over {MAX_HEAD} bytes")
        if len(line) > MAX_LINE:
            what = "request line" if not lines else "a header line"
            raise Refused(414 if not lines else 431, f"{what} over {MAX_LINE} bytes")
        if end < 0:
            continue
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            raise Refused(400, "every line of the head must end with CRLF, and only there")
        if line == b"\r\n":
            if not lines:
                raise Refused(400, "empty line where the request line belongs")
            return parse_head(lines)
        lines.append(bytes(line))
        line.clear()
        if len(lines) > MAX_HEADERS + 1:
            raise Refused(431, f"more than {MAX_HEADERS} headers")


class BoundedThreads(socketserver.ThreadingMixIn):
    """A threading server's mixin: one thread per connection, at most ``slots`` of them at once,
    so that clients without a key cannot make a server spend threads and memory without bound. A
    connection over the limit gets ``refuse`` (nothing, by default) and is closed unread."""

    daemon_threads = True
    block_on_close = False
    slots: threading.BoundedSemaphore

    if TYPE_CHECKING:

        def shutdown_request(self, request: Any) -> None: ...

    def refuse(self, request: socket.socket, client_address: Any) -> None:
        """What a connection over the limit is told before it is closed."""

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refuse(request, client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread started to release it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


# ---- answers a host program reads ----------------------------------------------------------------

# The most of an answer's status line and headers read (an engine's or a router's are well under 2 KiB).
ANSWER_HEAD = 64 * 1024
# What the socket reads ahead of the body's reader, at most (a buffered reader's two buffers).
_READ_AHEAD = 16 * 1024

_TOO_LONG = re.compile(r"got more than (\d+) bytes when reading (.+)")
_TOO_MANY = re.compile(r"got more than (\d+) headers")


class Unanswered(Exception):
    """A request that got no answer its caller may read: ``str()`` is one line, ``<where>: <what
    went wrong>``; ``reached``: whether anything accepted the connection (False: nothing listens
    there, or nothing could be reached in time)."""

    def __init__(self, where: str, reason: str, reached: bool) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason, self.reached = where, reason, reached


class _Overrun(OSError):
    """The socket's allowance of bytes is spent."""


class _Clocked(socket.socket):
    """A client socket whose every read and write ends by ``deadline`` (monotonic) and that
    receives at most ``allowance`` bytes in all: no peer holds a reader longer or makes it read
    more, however it sends (a byte at a time, a status line of 1xx answers without end)."""

    deadline = 0.0
    allowance = 0

    def _clock(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.settimeout(left)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._clock()
        if self.allowance <= 0:
            raise _Overrun("over the allowance")
        got = super().recv_into(buffer, min(nbytes or len(buffer), self.allowance), flags)
        self.allowance -= got
        return got

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._clock()
        if self.allowance <= 0:
            raise _Overrun("over the allowance")
        data = super().recv(min(bufsize, self.allowance), flags)
        self.allowance -= len(data)
        return data

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._clock()
        super().sendall(data, flags)


class _Connection(http.client.HTTPConnection):
    """``HTTPConnection`` over a ``_Clocked`` socket."""

    def __init__(self, host: str, port: int, deadline: float, allowance: int) -> None:
        super().__init__(host, port)
        self.deadline, self.allowance = deadline, allowance

    def connect(self) -> None:
        failed: OSError = OSError("no address to connect to")
        for family, kind, proto, _, address in socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM):
            sock = _Clocked(family, kind, proto)
            sock.deadline, sock.allowance = self.deadline, self.allowance
            try:
                sock._clock()
                sock.connect(address)
            except OSError as exc:
                sock.close()
                failed = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
            return
        raise failed


def _reason(exc: BaseException, timeout_s: float, max_bytes: int, headed: bool) -> str:  # noqa: PLR0911 (one case per failure)
    """What went wrong, in a few words (``headed``: the status line and headers had arrived)."""
    if isinstance(exc, TimeoutError):
        return f"no whole answer in {timeout_s:g} s" if headed else f"no answer in {timeout_s:g} s"
    if isinstance(exc, _Overrun):  # the body's framing (chunk sizes) counts, once it has come
        return f"an answer over {max_bytes} bytes" if headed else f"a status line and headers over {ANSWER_HEAD} bytes"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "closed the connection without an answer"
    if isinstance(exc, http.client.BadStatusLine):
        return f"not HTTP: status line {shown(str(exc.args[0] if exc.args else '').strip())}"
    if isinstance(exc, http.client.UnknownProtocol):
        return f"not HTTP/1.x: version {shown(str(exc.args[0] if exc.args else ''))}"
    if isinstance(exc, http.client.IncompleteRead):
        more = f", {exc.expected} more expected" if exc.expected else ""
        return f"an answer cut short ({len(exc.partial)} bytes read{more})"
    if isinstance(exc, http.client.HTTPException):
        said = " ".join(str(exc).split())
        if found := _TOO_LONG.fullmatch(said):
            return f"not HTTP: a {found.group(2)} over {found.group(1)} bytes"
        if found := _TOO_MANY.fullmatch(said):
            return f"not HTTP: more than {found.group(1)} headers"
        return f"not HTTP: {type(exc).__name__} {shown(said)}"
    if isinstance(exc, OSError):  # the system's words (connection refused, reset, no route)
        return " ".join(str(exc.strerror or exc or type(exc).__name__).split())[:120]
    return f"not HTTP: {shown(' '.join(str(exc).split()))}"


class Reply:
    """An answer whose status line and headers have arrived: ``status``, and its body, read by
    ``read`` or ``lines`` within the request's bounds."""

    def __init__(self, where: str, response: http.client.HTTPResponse, timeout_s: float, max_bytes: int) -> None:
        self.where, self.response, self.timeout_s, self.max_bytes = where, response, timeout_s, max_bytes
        self.status = response.status
        self.taken = 0

    def _failed(self, reason: str) -> Unanswered:
        return Unanswered(self.where, reason, reached=True)

    def _guarded(self, read: Callable[[], bytes]) -> bytes:
        try:
            return bytes(read())
        except (http.client.HTTPException, OSError, ValueError) as exc:
            raise self._failed(_reason(exc, self.timeout_s, self.max_bytes, headed=True)) from None

    def _took(self, data: bytes) -> None:
        self.taken += len(data)
        if self.taken > self.max_bytes:
            raise self._failed(f"an answer over {self.max_bytes} bytes")

    def _ended(self) -> None:
        """Refuses a body that ended before the length its head announced."""
        left = self.response.length
        if left:
            raise self._failed(f"an answer cut short ({self.taken} bytes read, {left} more expected)")

    def read(self) -> bytes:
        """The whole body; ``Unanswered`` when it is over ``max_bytes``, cut short or late."""
        data = bytearray()
        while True:
            chunk = self._guarded(functools.partial(self.response.read1, self.max_bytes + 1 - len(data)))
            if not chunk:
                self._ended()
                return bytes(data)
            data += chunk
            self._took(chunk)

    def lines(self, max_line: int) -> Iterator[bytes]:
        """The body's lines as they arrive, each with its end of line, at most ``max_line`` bytes
        each; ``Unanswered`` for a longer line, and as ``read`` does."""
        while True:
            line = self._guarded(functools.partial(self.response.readline, max_line + 1))
            if not line:
                self._ended()
                return
            self._took(line)
            if len(line) > max_line:
                raise self._failed(f"a line of the answer over {max_line} bytes")
            yield line


def where_of(url: str, what: str = "engine") -> str:
    """How a message names the peer at ``url``: ``engine at 127.0.0.1:8000``."""
    return f"{what} at {urllib.parse.urlsplit(url).netloc or shown(url)}"


@contextmanager
def answering(
    url: str, *, what: str = "engine", key: str | None = None, body: Any = None, timeout_s: float, max_bytes: int
) -> Iterator[Reply]:
    """The answer to a request of ``url`` (``http://HOST:PORT/PATH``, the plan's own): GET, or
    POST of ``body`` as JSON; ``key`` as a bearer token. ``Unanswered`` when no HTTP/1.x status
    line and headers arrive within the bounds (the module's docstring); the connection is
    closed when the block ends."""
    where = where_of(url, what)
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port or 80
    except ValueError:
        port = -1
    if parts.scheme != "http" or not parts.hostname or port <= 0:
        raise Unanswered(where, f"{shown(url)} is not an http://HOST:PORT URL", reached=False)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    deadline = time.monotonic() + timeout_s
    connection = _Connection(parts.hostname, port, deadline, max_bytes + ANSWER_HEAD + _READ_AHEAD)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    try:
        try:
            connection.connect()
        except (OSError, ValueError) as exc:
            raise Unanswered(where, _reason(exc, timeout_s, max_bytes, headed=False), reached=False) from None
        try:
            connection.request("POST" if data is not None else "GET", target, body=data, headers=headers)
            response = connection.getresponse()
        except (http.client.HTTPException, OSError, ValueError) as exc:
            raise Unanswered(where, _reason(exc, timeout_s, max_bytes, headed=False), reached=True) from None
        yield Reply(where, response, timeout_s, max_bytes)
    finally:
        connection.close()


@dataclass(frozen=True)
class Answer:
    """A whole answer: who gave it (``where``, as ``Unanswered`` names it), its status and body."""

    where: str
    status: int
    body: bytes


def ask(
    url: str, *, what: str = "engine", key: str | None = None, body: Any = None, timeout_s: float, max_bytes: int
) -> Answer:
    """The whole answer to a request (``answering``'s), or ``Unanswered``."""
    with answering(url, what=what, key=key, body=body, timeout_s=timeout_s, max_bytes=max_bytes) as reply:
        return Answer(reply.where, reply.status, reply.read())
