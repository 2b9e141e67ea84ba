"""One file of a pinned revision from the Hub, through the Hub's weather: retried, resumed, noted.

A file is asked for on its own: its metadata first (``HEAD /resolve``, huggingface_hub's
``get_hf_file_metadata``, with no retries of its own), whose ``X-Repo-Commit`` must be the pinned
revision and whose ETag the lock's digest (a lock that is not of this revision is named before a
byte is fetched); then its bytes, a ``GET`` of where the Hub sends them (its CDN: the token is not
sent to another origin, as huggingface_hub does not send it), with ``Accept-Encoding: identity`` so
that byte offsets are the file's, streamed into the file's partial file (flushed as they come: a
peer relays them at once) and hashed as they arrive. No byte past the lock's size is ever written:
a source that sends more fails the try, its partial file dropped (a source wrong about where the
file ends may be wrong about the rest).

Time is bounded too. A file has a deadline for all its tries and waits together, the longer of
``floor_s`` and its size at ``min_bytes_per_s`` (a source dripping a byte now and then never trips
a read timeout); the Hub's part of a sync has one for all its files (``sync_s``, by default the
time its files take one after another, ``at_once`` at a time, each within its deadline, and the
wait budget); a read that stalls ends within the read timeout after either. A file past either
deadline is out of tries at once, what it holds kept for the next sync.

A try that fails for a reason that passes (HTTP 408, 429 and 5xx; a connection refused, reset or
cut short; a timeout) is tried again after a wait: the answer's ``Retry-After``, or the reset of
the Hub's ``RateLimit`` header when no request is left in its window (the Hub's rate limits,
https://huggingface.co/docs/hub/rate-limits; the header's format as huggingface_hub 2.4.0 parses it), else
exponential backoff from ``backoff_s`` with jitter, at most ``MAX_BACKOFF_S`` (six tries ride out
about a minute of errors; huggingface_hub's own backoff, five of 1 to 8 s, about 23 s). Those
headers count only in ASCII digits, capped at the wait budget; any other value asks no wait (the
backoff's then). The next ``GET`` asks
for the rest (``Range: bytes=<have>-``) and goes on hashing where it stopped; a source that answers
with the whole body instead starts the file over in a new partial file. The partial file stays
when a sync ends, and the next sync resumes it (hashing what it holds once). Each retry is one line
in the progress log. A file is out of tries once ``attempts`` retries in a row brought no byte of
progress, once a wait would pass its deadline, or once it would pass ``budget_s``, the seconds
the whole sync may spend waiting (a second that several files wait counts once): ``OutOfTries``
names it and the last error. A file out of tries while no file received a byte since its tries
began (a Hub that answers metadata but no bytes included) means the Hub is down (``down``): the
other files stop at their next try, or in the middle of a wait, instead of riding out an outage
each in turn.
Anything else (401/403 of a gated or private repository, 404, a refused lock) is raised as it comes:
every file would meet it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from kimi_deploy.hostside.boundary_text import shown

if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import SyncRequest


# Statuses a later try may not meet (the client's own backoff retries these, utils/_http.py).
PASSING = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0
# What is read of an error answer's body, for its message.
ERROR_BODY = 64 << 10
_HEX = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
_DIGITS = re.compile(r"[0-9]+")
# The Hub's RateLimit header (https://huggingface.co/docs/hub/rate-limits), in ASCII.
_RATELIMIT = re.compile(r'"\w+"\s*;\s*r\s*=\s*([0-9]+)\s*;\s*t\s*=\s*([0-9]+)', re.ASCII)


class OutOfTries(Exception):
    """A file that failed ``tries`` times in a row: the file, and the last cause."""

    def __init__(self, rel: str, tries: int, cause: str) -> None:
        super().__init__(f"{rel}: out of tries after {tries}, last: {cause}")
        self.rel, self.tries, self.cause = rel, tries, cause


class BadToken(Exception):
    """The Hub says the token is not valid (401 to ``/api/whoami-v2``)."""


class Refused(Exception):
    """The Hub's answer about a file contradicts the lock: no try will do better."""


class TooLong(Exception):
    """A source sent more bytes of a file than the lock's size: a failed try."""


class Late(Exception):
    """A try passed the file's or the sync's deadline: the file's last try."""


@dataclass(frozen=True)
class Weather:
    """How long files are tried: ``attempts`` retries in a row without progress, waits from
    ``backoff_s`` up, at most ``budget_s`` seconds of waiting for the whole sync; each file within
    ``file_s(size)``, the Hub's part of the sync within ``sync_s`` (None: no such deadline)."""

    attempts: int = 6
    backoff_s: float = 1.0
    budget_s: float = 1800.0
    # A 5 GB shard may take 80 minutes; 8 at once on a link of 100 Mbit/s get about 1.5 MB/s each.
    min_bytes_per_s: float = float(1 << 20)
    # Room for the Hub's rate-limit window (5 minutes) and a small file's slow start.
    floor_s: float = 600.0
    sync_s: float | None = None

    def file_s(self, size: int) -> float:
        """The seconds a file of ``size`` bytes may take, all its tries and waits together."""
        return max(self.floor_s, size / self.min_bytes_per_s)

    def why_file_s(self) -> str:
        return f"the longer of {self.floor_s:g} s and its size at {self.min_bytes_per_s:.0f} bytes/s"

    def for_sync(self, sizes: list[int], at_once: int) -> Weather:
        """This weather with ``sync_s`` set when it is not: the files of ``sizes``, ``at_once`` at
        a time, each within its deadline (the longest may come last), and the wait budget."""
        if self.sync_s is not None or not sizes:
            return self
        each = [self.file_s(size) for size in sizes]
        return replace(self, sync_s=self.budget_s + sum(each) / max(1, at_once) + max(each))


def fresh_digest(kind: str, size: int) -> Any:
    """A new sha256 (LFS files), or sha1 primed with git's blob header (small files)."""
    if kind == "gitblob":
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(f"blob {size}\0".encode())
        return digest
    return hashlib.sha256()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


@dataclass
class _Partial:
    """What this process holds of a file: its partial file's inode, bytes and their running hash."""

    inode: int
    got: int
    digest: Any


class HubFiles:
    """The files of ``repo`` at ``revision`` from ``endpoint``, with the token of the environment
    (``HF_TOKEN_PATH``, set by the caller before huggingface_hub is imported)."""

    def __init__(self, req: SyncRequest, note: Callable[[str], None], weather: Weather) -> None:
        from huggingface_hub import constants  # noqa: PLC0415
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # noqa: PLC0415

        self.repo, self.revision = req["repo"], req["revision"]
        self.endpoint = req.get("endpoint") or None
        self.note, self.weather = note, weather
        # Names in lower case, as huggingface_hub builds them ("authorization" when a token is set).
        self.headers: dict[str, str] = dict(build_hf_headers())
        self.timeout = float(constants.HF_HUB_DOWNLOAD_TIMEOUT)
        self.held: dict[str, _Partial] = {}
        self.mutex = threading.Lock()
        self.retried: Counter[str] = Counter()
        # When a file last received a byte (or was found whole), and why the Hub counts as down.
        self.last_success = time.monotonic()
        self.down: str | None = None
        self.stopped = threading.Event()  # set with ``down``: waits end at once
        self.until = self.last_success + (math.inf if weather.sync_s is None else weather.sync_s)
        # The seconds of the sync some file waited (each second once), and when the last wait ends.
        self.waited, self.waiting_until = 0.0, 0.0

    def check_token(self) -> None:
        """Ask the Hub whose the token is, once, before a file: ``BadToken`` when it answers 401.
        Any other answer lets the files go ahead (they meet whatever the Hub has, and say it)."""
        import httpx2  # noqa: PLC0415
        from huggingface_hub import constants, get_session  # noqa: PLC0415

        if "authorization" not in self.headers:
            return
        url = f"{(self.endpoint or constants.ENDPOINT).rstrip('/')}/api/whoami-v2"
        try:
            answer = get_session().get(url, headers=dict(self.headers), timeout=self.timeout)
        except httpx2.TransportError:
            return
        if answer.status_code == 401:
            raise BadToken(url)

    def fetch(self, rel: str, size: int, want: str, partial: str) -> str:
        """Bring ``rel`` whole into ``partial``; returns the digest of what it holds then
        (``kind:hex``, or ``size:N`` when the source gave another size), for the caller to judge.
        ``OutOfTries`` when it cannot, within its deadline, the sync's, and the wait budget."""
        began = time.monotonic()
        until = min(began + self.weather.file_s(size), self.until)
        tries, streak = 0, began
        while True:
            if self.down is not None:
                raise OutOfTries(rel, tries, self.down)
            if time.monotonic() >= until:
                raise OutOfTries(rel, tries, self._late(until, partial, size))
            before = self._have(partial)
            try:
                found = self._try(rel, size, want, partial, until)
            except Late as late:
                self._given_up(streak, str(late))
                raise OutOfTries(rel, tries + 1, str(late)) from late
            except Exception as raised:
                error = _answered(raised)
                wait = self._passing(error)
                if wait is None:
                    raise
                if self._have(partial) > before:
                    tries, streak = 0, time.monotonic()
                tries += 1
                cause = _describe(error)
                if wait < 0:
                    wait = min(MAX_BACKOFF_S, self.weather.backoff_s * 2 ** (tries - 1)) * random.uniform(0.5, 1.5)  # noqa: S311 - spreads retries, no secret
                over = self._over(wait, until, size) if tries <= self.weather.attempts else ""
                if tries > self.weather.attempts or over:
                    cause = f"{cause}; {over}" if over else cause
                    self._given_up(streak, cause)
                    raise OutOfTries(rel, tries, cause) from error
                self.note(
                    f"{rel}: {cause}; retry {tries} of {self.weather.attempts} in {wait:.1f} s, "
                    f"from byte {self._have(partial)} of {size}"
                )
                with self.mutex:
                    self.retried[rel] += 1
                self.stopped.wait(wait)
            else:
                self._succeeded()
                return found

    def _over(self, wait: float, until: float, size: int) -> str:
        """Why ``wait`` may not be waited ("" when it may: then it is taken from the budget)."""
        now = time.monotonic()
        if now + wait > until:
            which = "the file's" if until < self.until else "the sync's"
            return f"waiting {wait:.0f} s more would pass {which} deadline"
        with self.mutex:
            more = max(0.0, now + wait - max(now, self.waiting_until))
            if self.waited + more > self.weather.budget_s:
                return f"waiting {wait:.0f} s more would pass the sync's wait budget of {self.weather.budget_s:g} s"
            self.waited += more
            self.waiting_until = max(self.waiting_until, now + wait)
        return ""

    def _late(self, until: float, partial: str, size: int) -> str:
        """Which deadline ``until`` is, and where the file stood at it."""
        at = f"at byte {self._have(partial)} of {size}"
        if until < self.until:
            return f"the file's deadline of {self.weather.file_s(size):g} s passed {at} ({self.weather.why_file_s()})"
        return f"the sync's deadline of {self.weather.sync_s:g} s passed {at}"

    def _given_up(self, streak: float, cause: str) -> None:
        """A file is out of tries: when the Hub answered nothing but errors since its tries began,
        to any file, the Hub is down, and the other files stop at their next try."""
        with self.mutex:
            if self.last_success < streak and self.down is None:
                self.down = f"{cause}, and nothing but errors for {time.monotonic() - streak:.0f} s"
                self.stopped.set()

    def _succeeded(self) -> None:
        self.last_success = time.monotonic()

    def forget(self, rel: str, partial: str) -> None:
        """Drop what is held of ``rel`` (its bytes were not the lock's): the next try starts over."""
        with self.mutex:
            self.held.pop(rel, None)
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)

    # -- one try --

    def _try(self, rel: str, size: int, want: str, partial: str, until: float) -> str:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url  # noqa: PLC0415

        kind = want.split(":", 1)[0]
        held = self._resume(rel, kind, size, partial)
        if held.got == size:
            return f"{kind}:{held.digest.hexdigest()}"
        url = hf_hub_url(self.repo, rel, revision=self.revision, endpoint=self.endpoint)
        timeout = min(float(constants.HF_HUB_ETAG_TIMEOUT), self._left(until, partial, size))
        meta = get_hf_file_metadata(
            url, headers=dict(self.headers), timeout=timeout, retry_on_errors=False, endpoint=self.endpoint
        )
        self._check(rel, want, meta.commit_hash, meta.etag)
        headers = {**self.headers, "Accept-Encoding": "identity"}
        if _origin(meta.location) != _origin(url):
            headers.pop("authorization", None)  # a signed CDN URL: the token stays with the Hub
        if held.got:
            headers["Range"] = f"bytes={held.got}-"
        held = self._get(rel, meta.location, headers, held, (kind, size, partial), until=until)
        return f"{kind}:{held.digest.hexdigest()}" if held.got == size else f"size:{held.got}"

    def _get(
        self,
        rel: str,
        location: str,
        headers: dict[str, str],
        held: _Partial,
        file: tuple[str, int, str],
        *,
        until: float,
    ) -> _Partial:
        """One GET of ``location`` into the partial file, from ``held``'s byte on; returns what is
        held then. ``file``: the digest kind, the size and the partial file of ``rel``. Never
        writes past the size (``TooLong``, the partial file dropped) nor reads on past ``until``
        (``Late``, the partial file kept)."""
        kind, size, partial = file
        import httpx2  # noqa: PLC0415
        from huggingface_hub import get_session, hf_raise_for_status  # noqa: PLC0415

        left = min(self.timeout, self._left(until, partial, size))
        with get_session().stream("GET", location, headers=headers, timeout=httpx2.Timeout(left)) as answer:
            if answer.status_code >= 400:
                # The Hub's message, for the error: a bounded part of it, read within the deadline.
                body = b""
                for block in answer.iter_bytes():
                    body += block[: ERROR_BODY - len(body)]
                    if len(body) >= ERROR_BODY or time.monotonic() >= until:
                        break
                hf_raise_for_status(
                    httpx2.Response(
                        answer.status_code,
                        headers=answer.headers,
                        content=body,
                        request=answer.request,
                        extensions=answer.extensions,
                    )
                )
            first = _range_start(answer.headers.get("Content-Range")) if answer.status_code == 206 else 0
            if first != held.got:
                # The whole body (a source that ignores Range), or another part: start over, in a
                # new partial file (a peer relaying the old one sees it end).
                if first != 0:
                    raise httpx2.RemoteProtocolError(f"asked for byte {held.got} on, was sent byte {first} on")
                self.forget(rel, partial)
                held = self._resume(rel, kind, size, partial)
            with open(partial, "ab") as out:
                # Bytes as the network gives them, not gathered first: a peer relays them at once.
                for block in answer.iter_bytes():
                    keep = block[: size - held.got]
                    if keep:
                        held.digest.update(keep)
                        out.write(keep)
                        out.flush()
                        held.got += len(keep)
                        self.last_success = time.monotonic()
                    if len(keep) < len(block):
                        out.close()
                        self.forget(rel, partial)
                        raise TooLong(f"the source sent more than the locked {size} bytes")
                    if time.monotonic() >= until:
                        raise Late(self._late(until, partial, size))
        return held

    def _left(self, until: float, partial: str, size: int) -> float:
        """The seconds left before ``until``; ``Late`` when none are."""
        left = until - time.monotonic()
        if left <= 0:
            raise Late(self._late(until, partial, size))
        return left

    def _resume(self, rel: str, kind: str, size: int, partial: str) -> _Partial:
        """What is held of ``rel``: this process's running hash of its partial file, or the hash
        of what an earlier sync left in it (read once), or a new empty partial file."""
        with self.mutex:
            held = self.held.get(rel)
            try:
                st = os.stat(partial)
            except FileNotFoundError:
                st = None
            if held is not None and st is not None and (st.st_ino, st.st_size) == (held.inode, held.got):
                return held
            if st is None or st.st_size > size:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(partial)
                os.makedirs(os.path.dirname(partial), exist_ok=True)
                with open(partial, "xb"):
                    pass
                held = _Partial(os.stat(partial).st_ino, 0, fresh_digest(kind, size))
            else:
                digest = fresh_digest(kind, size)
                with open(partial, "rb") as f:
                    got = 0
                    for block in iter(lambda: f.read(8 << 20), b""):
                        digest.update(block)
                        got += len(block)
                held = _Partial(st.st_ino, got, digest)
            self.held[rel] = held
            return held

    def _have(self, partial: str) -> int:
        try:
            return os.stat(partial).st_size
        except FileNotFoundError:
            return 0

    def _check(self, rel: str, want: str, commit: str | None, etag: str | None) -> None:
        """The Hub's metadata against the pins: the commit, and the file's ETag (sha256 of an LFS
        file, git blob id of another) against the lock's digest."""
        if commit and _HEX.match(self.revision) and commit != self.revision:
            raise Refused(f"{rel}: the Hub answers at commit {commit}, the pin is {self.revision}")
        digest = want.split(":", 1)[1]
        if etag and _HEX.match(etag) and len(etag) == len(digest) and etag != digest:
            raise Refused(
                f"{rel}: the Hub serves {etag} at {self.revision[:12]}, the lock says {want}: "
                "the lock is not of this revision"
            )

    def _passing(self, exc: BaseException) -> float | None:
        """None when ``exc`` does not pass; else the wait the answer asks for (-1: none asked)."""
        import httpx2  # noqa: PLC0415
        from huggingface_hub.errors import HfHubHTTPError  # noqa: PLC0415

        lasting = (httpx2.ProxyError, httpx2.UnsupportedProtocol)
        if isinstance(exc, TooLong) or (isinstance(exc, httpx2.TransportError) and not isinstance(exc, lasting)):
            return -1.0
        if not isinstance(exc, HfHubHTTPError | httpx2.HTTPStatusError) or exc.response is None:
            return None
        if exc.response.status_code not in PASSING:
            return None
        return asked_wait(exc.response.headers, self.weather.budget_s)


def _answered(exc: Exception) -> Exception:
    """The HTTP error behind ``exc`` when huggingface_hub failed while reading its answer (its
    ``hf_raise_for_status`` parses a ``RateLimit`` reset with ``int()``, which raises past 4,300
    digits), else ``exc``."""
    import httpx2  # noqa: PLC0415

    context = exc.__context__
    if isinstance(exc, ValueError) and isinstance(context, httpx2.HTTPStatusError):
        return context
    return exc


def asked_wait(headers: Any, cap: float) -> float:
    """The seconds an answer asks to wait, at most ``cap``, with up to a second of jitter: the
    reset of a ``RateLimit`` with no request left, else ``Retry-After`` in seconds; -1 when it
    asks none (or asks in anything but ASCII digits)."""
    limit = _RATELIMIT.search(headers.get("RateLimit") or "")
    if limit is not None and _seconds(limit.group(1), cap) == 0:
        reset = _seconds(limit.group(2), cap)
    else:
        reset = _seconds((headers.get("Retry-After") or "").strip(), cap)
    return -1.0 if reset is None else min(reset + random.uniform(0, 1), cap)  # noqa: S311 - spreads retries


def _seconds(text: str, cap: float) -> float | None:
    """``text`` as a number of seconds when it is ASCII digits alone, at most ``cap``."""
    if not _DIGITS.fullmatch(text):
        return None
    # int() of a few thousand digits raises: a number that long is past any cap.
    return cap if len(text) > 12 else min(float(int(text)), cap)


def _range_start(header: str | None) -> int:
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (header or "").strip())
    return int(match.group(1)) if match else -1


def _describe(exc: BaseException) -> str:
    """One line: the HTTP status and reason, or the kind of connection failure."""
    if isinstance(exc, TooLong):
        return str(exc)
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        method = getattr(getattr(response, "request", None), "method", "")
        phrase = getattr(response, "reason_phrase", "") or ""
        after = response.headers.get("Retry-After") if response is not None else None
        if after and not re.fullmatch(r"[0-9]{1,12}", after):
            after = shown(after, 40)
        return f"{method} answered {status} {phrase}".strip() + (f" (Retry-After {after})" if after else "")
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
