"""Sync one model revision and verify every file against the lock; or scrub it.

Run with the python of the tools venv that has huggingface_hub. Input: one argument, base64 of
zlib-compressed JSON, or ``--config FILE`` naming the same JSON in a file (the scrub timer):
{"repo", "revision", "dir", "lock": {path: [size, digest]}, "endpoint", "token_file", "retries",
"workers", "full", "peers": [{"host", "url"} | {"host", "path"}], "peer_key_file", "progress_log", "scrub",
"repair", "in_order", "hub_attempts", "hub_backoff_s", "hub_wait_budget_s", "hub_deadline_s",
"min_bytes_per_s", "file_floor_s"} (the last four bound time: ``hostside.hub_fetch.Weather``), and
"hub": false for files that only peers may give (a compile cache: ``compile_cache_place``).
Prints one JSON line; exit 0 when every file matches the lock, 3 when the disk is too small
(nothing downloaded), 4 when a file still mismatches after retries (or, scrubbing without repair,
when a file is corrupted; or when the Hub's metadata contradicts the lock), 5 when the Hub fails
(a file out of tries, the others placed; a gated repository), 6 when the lock names a file that could leave the
revision folder (``hostside.boundary_names``: checked before anything is removed or written, and
again for every path opened, linked or removed, symlinks resolved).

Files come from ``peers`` first (a local mirror folder such as a network mount, then hosts of the
same run serving what they verified or relaying what they receive, see weights_peer.py), each
hashed while it streams in and recorded in the verification cache once placed; whatever no source
could give comes from the Hub, each file on its own (``hostside.hub_fetch``: retried through
rate limits, server errors and dropped connections with backoff, resumed with Range where it
stopped, in this run or the next; each retry a line of the progress log), streamed into its
partial file like a peer's and hashed as it arrives. With ``in_order`` (the host others fetch from
while it fetches), files come in the lock's order, a few at a time, so the next host receives each
at once.
Verification results are cached in DIR/.kimi/verify-cache.json by (size, mtime_ns, inode), so an
unchanged file is never hashed twice; a verified file not readable by all gets mode 0644 back. A
scrub re-hashes every file whatever the cache says. Syncs and scrubs of one revision take turns (a
lock file), and progress (bytes, rate, ETA) is appended to ``progress_log`` every few seconds;
while files arrive, ``DIR/.kimi/progress`` holds the bytes in and to come, for the controller
(``hostside.progress_file``, every second).
"""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import random
import re
import shutil
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kimi_deploy.hostside.boundary_names import BadName, check_names, inside
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.hostside.hub_access import GATED_ERROR, HUB, gated_line, token_line
from kimi_deploy.hostside.hub_fetch import BadToken, HubFiles, OutOfTries, Refused, Weather, fresh_digest
from kimi_deploy.hostside.progress_file import remove_progress, write_progress
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.revision_files import CACHE, META, PROGRESS, load_cache, meta, partial_path

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import PeerSource, SyncRequest


# Every file of a revision is readable by all (the engines run as a user of their own), written by root.
FILE_MODE = 0o644
READABLE = 0o444
PROGRESS_EVERY_S = 5.0
# The controller's file: a stat of each file still to come and of the partial ones, every second.
PROGRESS_FILE_EVERY_S = 1.0
# How long a fetch waits its turn at a peer that says it is busy or has the file still to come
# (HTTP 503) before the next source: a chain's first hop waits for a whole file from the Hub.
BUSY_WAIT_S = 3600.0
# Files fetched from the Hub at once by a host that others fetch from while it fetches, and by
# any other host (huggingface_hub's snapshot_download default).
IN_ORDER_AT_ONCE = 4
HUB_AT_ONCE = 8
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|gitblob:[0-9a-f]{40})$")


def _hash(path: str, kind: str, size: int) -> str:
    """``sha256:<hex>`` (LFS files) or ``gitblob:<hex>`` (git's blob id, for small files)."""
    digest = fresh_digest(kind, size)
    with open(path, "rb") as f:
        # hashlib releases the GIL on large updates: threads hash files in parallel.
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return f"{kind}:{digest.hexdigest()}"


def _save_cache(root: str, lock: dict[str, list[Any]], cache: dict[str, list[Any]]) -> None:
    """Save the verdicts on the lock's files: a peer serves a file once it is recorded here."""
    _save_json(root, CACHE, {r: cache[r] for r in lock if r in cache})


def _save_json(root: str, name: str, data: Any) -> None:
    os.makedirs(os.path.join(root, META), exist_ok=True)
    tmp = os.path.join(root, META, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, os.path.join(root, META, name))


def _prune(root: str, lock: dict[str, list[Any]]) -> list[str]:
    """Remove files the lock does not name (and partial downloads); keep metadata folders."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in (META, ".cache")]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel not in lock:
                os.remove(os.path.join(dirpath, name))
                removed.append(rel)
    # What a killed run left half-fetched (no other sync runs: the revision's lock), unless the
    # lock names its file and that file is not in place: that one the Hub resumes.
    partials = os.path.dirname(partial_path(root, ""))
    kept = {os.path.basename(partial_path(root, rel)) for rel in lock if not os.path.lexists(inside(root, rel))}
    for name in os.listdir(partials) if os.path.isdir(partials) else []:
        if name not in kept:
            os.remove(os.path.join(partials, name))
            removed.append(os.path.join(META, "partial", name))
    incomplete = os.path.join(root, ".cache", "huggingface", "download")
    for dirpath, _, filenames in os.walk(incomplete):
        for name in filenames:
            if name.endswith(".incomplete"):
                os.remove(os.path.join(dirpath, name))
                removed.append(os.path.relpath(os.path.join(dirpath, name), root))
    return removed


def _open_folders(root: str, lock: dict[str, list[Any]]) -> None:
    """Every folder the engines (their own user) read the weights through, from the model's folder
    down, listable and enterable by all (r-x added to what its mode gives; hostside/state_probe.py
    counts the files under a closed one as unreadable)."""
    folders = {root, os.path.dirname(root)}
    for rel in lock:
        folder = os.path.dirname(inside(root, rel))
        while len(folder) > len(root):
            folders.add(folder)
            folder = os.path.dirname(folder)
    for folder in sorted(folders):
        try:
            mode = stat.S_IMODE(os.stat(folder).st_mode)
        except OSError:
            continue
        if mode & 0o555 != 0o555:
            os.chmod(folder, mode | 0o555)  # noqa: S103 - the weights are public to the host's users by design


def _verify(root: str, lock: dict[str, list[Any]], cache: dict[str, list[Any]], workers: int) -> list[str]:
    """Files that do not match the lock; updates ``cache`` for every file hashed."""

    def check(rel: str) -> str | None:
        size, sha = lock[rel]
        path = inside(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            return rel
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = cache.get(rel)
        if entry is not None and entry[:3] == key:
            found = entry[3]
        else:
            kind = sha.split(":", 1)[0]
            found = _hash(path, kind, size) if st.st_size == size else f"size:{st.st_size}"
            cache[rel] = [*key, found]
        if found == sha and stat.S_IMODE(st.st_mode) & READABLE != READABLE:
            # The engines read the files as their own user: a verified file they cannot read gets
            # its mode back (a change of ctime alone: the cache's key stays).
            os.chmod(path, FILE_MODE)
        return None if found == sha else rel

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sorted(r for r in pool.map(check, sorted(lock)) if r is not None)


def _fail(result: dict[str, Any], message: str, code: int) -> None:
    """One line for the operator (stderr), the details as JSON (stdout, shown with -v)."""
    print(json.dumps(result))
    print(f"kimi-deploy: {message}", file=sys.stderr)
    sys.exit(code)


def _link_from_siblings(root: str, lock: dict[str, list[Any]], cache: dict[str, list[Any]]) -> list[str]:
    """Hard-link files another revision of the same model already holds verified with the same
    digest: an upgrade downloads only what changed, and both revisions stay whole on disk."""
    parent = os.path.dirname(root.rstrip("/"))
    wanted = {lock[rel][1]: rel for rel in lock if not os.path.exists(inside(root, rel))}
    linked: list[str] = []
    if not wanted or not os.path.isdir(parent):
        return linked
    for sibling in sorted(os.listdir(parent)):
        other = os.path.join(parent, sibling)
        if other == root.rstrip("/") or not os.path.isdir(other):
            continue
        for rel, entry in load_cache(other).items():
            target = wanted.get(entry[3])
            if target is None or os.path.exists(path := inside(root, target)):
                continue
            try:
                # Another revision's cache is no lock: its names are checked like any other.
                source = inside(other, rel)
                st = os.stat(source)
                if [st.st_size, st.st_mtime_ns, st.st_ino] != entry[:3]:
                    continue  # changed since it was verified: not to be trusted
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.link(source, path)
            except (OSError, BadName):
                continue
            cache[target] = list(entry)
            linked.append(target)
    return linked


def _open_source(source: PeerSource, rel: str, key: str | None) -> Any:
    """A readable stream of ``rel`` from a source: a peer's URL, or a local folder (a mount)."""
    if "path" in source:
        return open(inside(source["path"], rel), "rb")
    url = source.get("url", "")
    if not url.startswith("http://"):
        raise ValueError(f"peer URL {url!r} is not http://")
    request = urllib.request.Request(f"{url}/{urllib.parse.quote(rel)}", headers={"Authorization": f"Bearer {key}"})  # noqa: S310 - checked above
    return urllib.request.urlopen(request, timeout=30)  # noqa: S310


class Mismatch(ValueError):
    """The bytes a source gave are not the lock's (``_receive``)."""


class _Sink:
    """Where a file's bytes from a peer or a mirror land as they arrive: hashed and written to its
    partial file, flushed at once (a host fetching from this one relays them as they come). Never
    past ``size`` (``Mismatch``), nor past ``weather``'s deadline for the file (``TimeoutError``)."""

    def __init__(self, out: BinaryIO, fresh: Callable[[], Any], size: int, weather: Weather) -> None:
        self.out, self.size, self.weather = out, size, weather
        self.digest, self.got = fresh(), 0
        self.until = time.monotonic() + weather.file_s(size)

    def write(self, block: bytes) -> int:
        keep = block[: self.size - self.got]
        self.digest.update(keep)
        self.out.write(keep)
        self.out.flush()
        self.got += len(keep)
        if len(keep) < len(block):
            raise Mismatch(f"the source sent more than the locked {self.size} bytes")
        if time.monotonic() >= self.until:
            raise TimeoutError(
                f"the file's deadline of {self.weather.file_s(self.size):g} s passed at byte "
                f"{self.got} of {self.size} ({self.weather.why_file_s()})"
            )
        return len(block)


def _receive(
    root: str, rel: str, entry: list[Any], fill: Callable[[_Sink], None], weather: Weather
) -> tuple[list[Any], int]:
    """One file into a partial file, hashed as it arrives (``fill`` writes its bytes to the sink,
    from a peer, a mirror or the Hub); moved into place only when it matches the lock. Returns the
    cache entry of the placed file and its size. A failed try leaves no partial file: a host
    relaying it sees it gone and ends its own answer short. (The Hub's files are resumed instead:
    ``hostside.hub_fetch``.)"""
    size, want = entry
    kind = want.split(":", 1)[0]
    target = inside(root, rel)
    partial = partial_path(root, rel)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial)  # every try a new inode: a relay of an earlier try cannot read this one
    try:
        with open(partial, "wb") as out:
            sink = _Sink(out, lambda: fresh_digest(kind, size), size, weather)
            fill(sink)
        found = f"{kind}:{sink.digest.hexdigest()}" if sink.got == size else f"size:{sink.got}"
        if found != want:
            raise Mismatch(f"expected {want}, found {found}")
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
        raise
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(partial, target)
    st = os.stat(target)
    return [st.st_size, st.st_mtime_ns, st.st_ino, found], size


def _fetch_from(
    root: str, rel: str, entry: list[Any], source: PeerSource, key: str | None, *, weather: Weather
) -> tuple[list[Any], int]:
    """``_receive`` of one file from a source: a peer's URL or a local folder."""

    def fill(sink: _Sink) -> None:
        with _open_source(source, rel, key) as answer:
            for block in iter(lambda: answer.read1(1 << 20), b""):
                sink.write(block)

    return _receive(root, rel, entry, fill, weather)


def _fetch_busy(
    root: str, rel: str, entry: list[Any], source: PeerSource, key: str | None, *, weather: Weather
) -> tuple[list[Any], int]:
    """``_fetch_from``, waiting its turn while the source says it is busy (503 with Retry-After:
    it serves as many hosts at once as it may), for up to ``BUSY_WAIT_S``: a busy source is no
    reason to take the file from the Hub."""
    until = time.monotonic() + BUSY_WAIT_S
    while True:
        try:
            return _fetch_from(root, rel, entry, source, key, weather=weather)
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() >= until:
                raise
            wait = exc.headers.get("Retry-After", "1") if exc.headers else "1"
            delay = float(wait) if wait.isdigit() else 1.0
            time.sleep(min(delay, 30.0) * random.uniform(0.5, 1.5))  # noqa: S311 - spreads retries, no secret


def _from_peers(
    root: str, lock: dict[str, list[Any]], bad: list[str], req: SyncRequest, cache: dict[str, list[Any]]
) -> tuple[list[str], dict[str, int], dict[str, str]]:
    """Fetch ``bad`` files from the sources (a local mirror folder, the run's peers), each from
    the first that gives it; returns the files placed, the bytes each source gave, and for each file no source could
    give, the last cause."""
    peers = req.get("peers") or []
    if not peers or not bad:
        return [], {}, {}
    key = None
    key_file = req.get("peer_key_file")
    if any("url" in p for p in peers) and key_file:
        with open(key_file, encoding="utf-8") as f:
            key = f.read().strip()
    given: dict[str, int] = {}
    causes: dict[str, str] = {}
    mutex = threading.Lock()
    weather = _weather(req)

    def one(rel: str) -> str | None:
        for peer in peers:  # in the planner's order: the host before this one in its chain first
            try:
                entry, size = _fetch_busy(root, rel, lock[rel], peer, key, weather=weather)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                with mutex:
                    causes[rel] = f"{peer['host']}: {type(exc).__name__}: {exc}"
                continue
            with mutex:
                cache[rel] = entry
                _save_cache(root, lock, cache)
                given[peer["host"]] = given.get(peer["host"], 0) + size
                causes.pop(rel, None)
            return rel
        return None

    with ThreadPoolExecutor(max_workers=min(4, len(bad))) as pool:
        placed = [r for r in pool.map(one, bad) if r is not None]
    return placed, given, causes


class Progress:
    """Appends ``<time> <what>: <done> of <total> (<pct>), <rate>, ETA <s>`` to a log every few
    seconds while files arrive, counting finished files and partial ones; and keeps the same
    bytes in the progress ``file`` every second (removed at the end)."""

    def __init__(self, log: str | None, label: str, root: str, wanted: dict[str, int], file: str | None = None) -> None:
        self.log, self.label, self.root, self.wanted, self.file = log, label, root, wanted, file
        self.total = sum(wanted.values())
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        if (self.log or self.file) and self.wanted:
            if self.file:
                write_progress(self.file, self._done(), self.total)
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join()
            if self.log:
                self._write(final=True)
        if self.file:
            remove_progress(self.file)

    def _done(self) -> int:
        done = 0
        for rel, size in self.wanted.items():
            with contextlib.suppress(OSError):
                done += min(size, os.stat(os.path.join(self.root, rel)).st_size)
        hub_partials = os.path.join(self.root, ".cache", "huggingface", "download")
        for folder in (os.path.dirname(partial_path(self.root, "")), hub_partials):
            for dirpath, _, names in os.walk(folder):
                for name in names:
                    with contextlib.suppress(OSError):
                        done += os.stat(os.path.join(dirpath, name)).st_size
        return min(done, self.total)

    def _write(self, final: bool = False, done: int | None = None) -> None:
        done = self._done() if done is None else done
        seconds = max(time.monotonic() - self.started, 1e-6)
        rate = done / seconds
        eta = "done" if final else (f"ETA {(self.total - done) / rate:.0f} s" if rate > 0 else "ETA unknown")
        percent = 100 * done // max(self.total, 1)
        self.note(f"{_size(done)} of {_size(self.total)} ({percent}%), {_size(int(rate))}/s, {eta}")

    def note(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with contextlib.suppress(OSError):
            if self.log:
                os.makedirs(os.path.dirname(self.log), exist_ok=True)
                with open(self.log, "a", encoding="utf-8") as f:
                    f.write(f"{stamp} {self.label}: {text}\n")

    def _run(self) -> None:
        every = PROGRESS_FILE_EVERY_S if self.file else PROGRESS_EVERY_S
        logged = time.monotonic()
        while not self.stop.wait(every):
            done = self._done()
            if self.file:
                write_progress(self.file, done, self.total)
            if self.log and time.monotonic() - logged >= PROGRESS_EVERY_S - every / 2:
                logged = time.monotonic()
                self._write(done=done)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"


@contextlib.contextmanager
def _exclusive(root: str) -> Iterator[None]:
    """One sync or scrub of a revision at a time: a deploy waits for a running scrub."""
    os.makedirs(os.path.join(root, META), exist_ok=True)
    with open(meta(root, "lock"), "w", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        # Begun and ended, whatever the result: a peer relaying this host's files knows whether
        # more may come (weights_peer.Peer.arriving).
        with open(meta(root, "sync-started"), "w", encoding="utf-8"):
            pass
        try:
            yield
        finally:
            with contextlib.suppress(OSError), open(meta(root, "synced"), "w", encoding="utf-8"):
                pass


def _request(argv: list[str]) -> SyncRequest:
    """The request in argv, or in the file the scrub's unit names (``--config FILE``): the
    controller wrote both (``kimi_deploy.converge.plan.sync_request``)."""
    if len(argv) == 3 and argv[1] == "--config":
        with open(argv[2], encoding="utf-8") as f:
            data: SyncRequest = json.load(f)
            return data
    request: SyncRequest = read_request(argv)
    return request


def check_request(req: SyncRequest) -> None:
    """Every lock name is a relative path inside the revision folder (symlinks resolved), every
    entry ``[size, digest]``; ``BadName`` otherwise. Run before anything is removed or written."""
    root, lock = req["dir"], req["lock"]
    for rel in check_names(lock):
        inside(root, rel)
        entry = lock[rel]
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], int)
            and entry[0] >= 0
            and isinstance(entry[1], str)
            and _DIGEST.match(entry[1])
        ):
            raise BadName(rel, f"the lock's entry must be [size, sha256:/gitblob: digest], found {shown(entry)}")


def main() -> None:
    req = _request(sys.argv)
    label = f"weights {req['repo']}@{req['revision'][:12]}"
    try:
        check_request(req)
        with _exclusive(req["dir"]):
            sync(req)
    except BadName as exc:
        _fail({"error": "name", "message": str(exc)}, f"{label}: {req['dir']}: {exc}", 6)
    except Refused as exc:
        _fail({"error": "lock", "message": str(exc)}, f"{label}: {req.get('endpoint') or HUB}: {exc}", 4)
    except Exception as exc:  # noqa: BLE001 - whatever the Hub client raises, say it in one line
        # The client often wraps the HTTP error ("failed due to the above error"): name the root,
        # unless the client said on the way that the repository is gated.
        chain = [exc]
        while chain[-1].__cause__ is not None or (
            chain[-1].__context__ is not None and not chain[-1].__suppress_context__
        ):
            chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
        where = req.get("endpoint") or "the Hub"
        gated = next((e for e in chain if type(e).__name__ == GATED_ERROR), None)
        if gated is not None:
            status = _status_of(gated)
            line = gated_line(req["repo"], req.get("endpoint") or HUB, status)
            _fail({"error": "gated", "status": status, "message": line}, f"{label}: {where}: {line}", 5)
        token_file = req.get("token_file")
        sent = bool(token_file) and os.path.exists(token_file or "")
        refused = next(
            (
                e
                for e in chain
                if isinstance(e, BadToken)
                or (sent and _status_of(e) == 401 and type(e).__name__ != "RepositoryNotFoundError")
            ),
            None,
        )
        if refused is not None:
            line = token_line(req.get("endpoint") or HUB, req.get("token_file"))
            _fail({"error": "token", "status": 401, "message": line}, f"{label}: {where}: {line}", 5)
        exc = chain[-1]
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        _fail(
            {"error": "hub", "type": type(exc).__name__, "message": first},
            f"{label}: {where}: {type(exc).__name__}: {first}",
            5,
        )


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of the answer an exception carries (huggingface_hub's errors do), if any."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _remove(root: str, names: list[str]) -> None:
    """Remove ``<root>/<name>`` for each name: a symlink itself, never what it points at."""
    for rel in names:
        path = inside(root, rel)
        if os.path.lexists(path):
            os.remove(path)


def _hub_environment(req: SyncRequest) -> None:
    """huggingface_hub's settings, before it is imported: the endpoint, the token file, the HTTP
    path (not Xet), no telemetry, no progress bars, no chatter that would bury the one line."""
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    endpoint, token_file = req.get("endpoint"), req.get("token_file")
    if endpoint:
        os.environ["HF_ENDPOINT"] = endpoint
    if token_file and os.path.exists(token_file):
        os.environ["HF_TOKEN_PATH"] = token_file
    from huggingface_hub.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


@dataclass
class HubOutcome:
    """What ``_from_hub`` did: the files fetched, those still not the lock's, those out of tries
    (and why), the retries of each file, and why the Hub counted as down (None: it did not)."""

    fetched: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    out_of_tries: dict[str, OutOfTries] = field(default_factory=dict)
    retried: dict[str, int] = field(default_factory=dict)
    down: str | None = None


def _weather(req: SyncRequest) -> Weather:
    """The request's bounds on tries and time, each the default where it names none."""

    def given(value: float | None, default: float) -> float:
        return default if value is None else float(value)

    base = Weather()
    attempts = req.get("hub_attempts")
    deadline = req.get("hub_deadline_s")
    return Weather(
        attempts=base.attempts if attempts is None else int(attempts),
        backoff_s=given(req.get("hub_backoff_s"), base.backoff_s),
        budget_s=given(req.get("hub_wait_budget_s"), base.budget_s),
        min_bytes_per_s=given(req.get("min_bytes_per_s"), base.min_bytes_per_s),
        floor_s=given(req.get("file_floor_s"), base.floor_s),
        sync_s=None if deadline is None else float(deadline),
    )


def _from_hub(
    req: SyncRequest,
    *,
    root: str,
    lock: dict[str, list[Any]],
    bad: list[str],
    cache: dict[str, list[Any]],
    note: Callable[[str], None],
) -> HubOutcome:
    """Fetch ``bad`` from the Hub, each file on its own (``hostside.hub_fetch``: retried through
    the Hub's weather, resumed where it stopped), a file whose bytes are not the lock's fetched
    again up to ``retries`` times. A file out of tries stops no other. An error every file would
    meet (a gated repository, a lock the Hub contradicts) stops the files not yet begun and is
    raised."""
    _hub_environment(req)
    # A host others fetch from while it fetches takes files in the lock's order (theirs too), a
    # few at a time (one alone would leave the link idle between files; all at once would starve
    # the file the next host waits for); every host otherwise takes as many at once as
    # huggingface_hub's snapshot_download does.
    at_once = IN_ORDER_AT_ONCE if req.get("in_order") else HUB_AT_ONCE
    hub = HubFiles(req, note, _weather(req).for_sync([lock[rel][0] for rel in bad], at_once))
    hub.check_token()
    _remove(root, bad)
    fetched: list[str] = []
    mismatched: list[str] = []
    out_of_tries: dict[str, OutOfTries] = {}
    retries = int(req.get("retries", 2))
    fatal: list[BaseException] = []
    mutex = threading.Lock()

    def one(rel: str) -> None:
        size, want = lock[rel]
        partial = partial_path(root, rel)
        for attempt in range(retries + 1):
            if fatal:
                return
            try:
                found = hub.fetch(rel, size, want, partial)
            except OutOfTries as exc:
                with mutex:
                    out_of_tries[rel] = exc
                return
            except Exception as exc:  # noqa: BLE001 - raised again below, once the pool is done
                with mutex:
                    fatal.append(exc)
                return
            if found == want:
                target = inside(root, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.chmod(partial, FILE_MODE)
                os.replace(partial, target)
                st = os.stat(target)
                with mutex:
                    fetched.append(rel)
                    cache[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, found]
                    _save_cache(root, lock, cache)
                return
            hub.forget(rel, partial)
            with mutex:
                cache[rel] = [None, None, None, found]  # its verdict, on no file: never served
            if attempt < retries:
                note(f"{rel}: expected {want}, found {found}; fetched again ({attempt + 1} of {retries})")
        with mutex:
            mismatched.append(rel)

    with ThreadPoolExecutor(max_workers=max(1, min(at_once, len(bad)))) as pool:
        list(pool.map(one, sorted(bad)))
    if fatal:
        raise fatal[0]
    return HubOutcome(fetched, sorted(mismatched), out_of_tries, dict(sorted(hub.retried.items())), hub.down)


def sync(req: SyncRequest) -> None:
    root, lock = req["dir"], req["lock"]
    started = time.monotonic()
    scrub = bool(req.get("scrub"))
    os.makedirs(root, exist_ok=True)
    _open_folders(root, lock)
    removed = _prune(root, lock)
    # A full verify (and a scrub) trusts nothing cached: every file is hashed again.
    full = bool(req.get("full")) or scrub
    cache = {} if full else load_cache(root)
    linked = [] if full else _link_from_siblings(root, lock, cache)
    workers = int(req.get("workers") or max(2, os.cpu_count() or 2))
    bad = _verify(root, lock, cache, workers)
    corrupted = {rel: cache.get(rel, [None] * 4)[3] for rel in bad}
    if scrub:
        for rel, found in corrupted.items():
            print(f"kimi-deploy: scrub: {rel}: expected {lock[rel][1]}, found {found}", file=sys.stderr)
        _save_json(
            root,
            "scrub.json",
            {"time": time.time(), "checked": len(lock), "corrupted": corrupted, "repair": bool(req.get("repair"))},
        )
        if bad and not req.get("repair"):
            _save_cache(root, lock, cache)
            rel = bad[0]
            _fail(
                {"error": "corrupted", "files": corrupted},
                f"scrub: {len(bad)} of {len(lock)} files do not match the lock, first {rel}: "
                f"expected {lock[rel][1]}, found {corrupted[rel]}",
                4,
            )
    have = sum(lock[r][0] for r in lock if r not in bad)
    need = sum(size for size, _ in lock.values()) - have
    free = shutil.disk_usage(root).free
    if bad and need > free:
        _fail(
            {"error": "disk", "needed": need, "free": free, "dir": root},
            f"weights need {need} more bytes in {root}, {free} are free",
            3,
        )
    fetched: list[str] = []
    from_peers: dict[str, int] = {}
    peer_causes: dict[str, str] = {}
    label = f"{req['repo']}@{req['revision'][:12]}"
    hub = HubOutcome()
    wanted = {r: lock[r][0] for r in bad}
    with Progress(req.get("progress_log"), label, root, wanted, meta(root, PROGRESS)) as progress:
        placed, from_peers, peer_causes = _from_peers(root, lock, bad, req, cache)
        bad = [r for r in bad if r not in placed]
        if bad and req.get("hub") is False:
            _save_cache(root, lock, cache)
            rel = bad[0]
            cause = peer_causes.get(rel) or next(iter(peer_causes.values()), "no peer had it")
            _fail(
                {"error": "peers", "files": sorted(bad), "peer_failures": peer_causes},
                f"{label}: {len(bad)} of {len(lock)} files from no peer, first {rel}: {shown(cause)} "
                "(this sync asks no Hub)",
                5,
            )
        if bad:
            hub = _from_hub(req, root=root, lock=lock, bad=bad, cache=cache, note=progress.note)
            fetched, bad = hub.fetched, hub.mismatched
    _save_cache(root, lock, cache)
    if hub.out_of_tries:
        failed = hub.out_of_tries
        rel = sorted(failed)[0]
        if hub.down is not None:
            what = f"the Hub is down: {hub.down}; {len(failed)} of {len(lock)} files not fetched, first {rel}"
        else:
            first = failed[rel]
            what = f"{len(failed)} of {len(lock)} files out of tries, first {rel} after {first.tries}: {first.cause}"
        _fail(
            {"error": "hub", "files": {r: e.cause for r, e in sorted(failed.items())}, "fetched": sorted(fetched)},
            f"weights {label}: {req.get('endpoint') or HUB}: {what} (the rest are in place; a run again resumes)",
            5,
        )
    if bad:
        rel = bad[0]
        found = cache.get(rel, [None] * 4)[3]
        _fail(
            {"error": "mismatch", "file": rel, "expected": lock[rel][1], "found": found},
            f"{rel} does not match the lock after retries: expected {lock[rel][1]}, found {found}",
            4,
        )
    if placed or fetched:
        given = ", ".join(f"{n} bytes from {h}" for h, n in sorted(from_peers.items()))
        hub_bytes = sum(lock[r][0] for r in set(fetched))
        retries = f", {sum(hub.retried.values())} retries" if hub.retried else ""
        Progress(req.get("progress_log"), label, root, {}).note(
            f"{len(placed)} files from peers ({given or 'none'}), {len(set(fetched))} files ({hub_bytes} bytes) "
            f"from {req.get('endpoint') or 'the Hub'}{retries}"
        )
    if scrub and corrupted:
        _save_json(
            root,
            "scrub.json",
            {"time": time.time(), "checked": len(lock), "corrupted": corrupted, "repaired": sorted(corrupted)},
        )
        print(f"kimi-deploy: scrub: re-fetched {len(corrupted)} corrupted files", file=sys.stderr)
    print(
        json.dumps(
            {
                "ok": True,
                "fetched": sorted(set(fetched)),
                "from_peers": from_peers,
                "peer_failures": peer_causes,
                "linked": len(linked),
                "removed": removed,
                "corrupted": sorted(corrupted),
                "hub_retries": hub.retried,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
