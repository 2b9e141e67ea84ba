"""A client's HTTP request head, read within bounds and checked before anything acts on it.

The one place for the rules the host's one hand-written HTTP server (the weights peer) applies to what a client sends:

- ``read_head``: the request line and headers, read while counting (a line at most ``MAX_LINE``
  bytes, at most ``MAX_HEADERS`` headers, the whole head at most ``MAX_HEAD`` bytes) and against a
  clock (the first byte within ``wait_s``, the whole head within ``head_s``), so a client that
  sends slowly, sends nothing or sends a lot holds neither a thread nor memory for long.
- ``parse_head``: ``METHOD SP origin-form-target SP HTTP/1.0|HTTP/1.1``, header lines
  ``token ":" value`` with no control character and no obsolete line folding; ``Authorization``,
  ``Content-Length``, ``Content-Type``, ``Expect`` and ``Host`` at most once; a ``Content-Length``
  of digits only.

Every refusal is ``Refused``: the HTTP status to answer and one line naming the rule and what was
found (a value shown cut short, never a key). Stdlib only: the host programs run this code bundled.
"""

from __future__ import annotations

import re
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hostside.boundary_text import shown

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
