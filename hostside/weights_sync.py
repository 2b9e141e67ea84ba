"""Sync one model revision and verify every file against the lock; or scrub it.

Run with the python of the tools venv that has huggingface_hub. Input: one argument, base64 of
zlib-compressed JSON, or ``--config FILE`` naming the same JSON in a file (the scrub timer):
{"repo", "revision", "dir", "lock": {path: [size, digest]}, "endpoint", "token_file", "retries",
"workers", "full", "peers": [{"host", "url"} | {"host", "path"}], "peer_key_file", "progress_log", "scrub",
"repair", "in_order"}.
Prints one JSON line; exit 0 when every file matches the lock, 3 when the disk is too small
(nothing downloaded), 4 when a file still mismatches after retries (or, scrubbing without repair,
when a file is corrupted), 5 when the Hub fails, 6 when the lock names a file that could leave the
revision folder (``hostside.boundary_names``: checked before anything is removed or written, and
again for every path opened, linked or removed, symlinks resolved).

Files come from ``peers`` first (a local mirror folder such as a network mount, then hosts of the
same run serving what they verified or relaying what they receive, see weights_peer.py), each
hashed while it streams in and recorded in the verification cache once placed; whatever no source
could give comes from the Hub. With ``in_order`` (the host others fetch from while it fetches),
files come from the Hub in the lock's order, a few at a time, each streamed into its partial file
like a peer's and hashed as it arrives, so the next host receives it at once.
Verification results are cached in DIR/.kimi/verify-cache.json by (size, mtime_ns, inode), so an
unchanged file is never hashed twice; a verified file not readable by all gets mode 0644 back. A
scrub re-hashes every file whatever the cache says. Syncs and scrubs of one revision take turns (a
lock file), and progress (bytes, rate, ETA) is appended to ``progress_log`` every few seconds.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import glob
import hashlib
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
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from hostside.boundary_names import BadName, check_names, inside
from hostside.boundary_text import shown
from hostside.hub_access import GATED_ERROR, gated_line
from hostside.revision_files import CACHE, META, load_cache, meta, partial_path

# huggingface_hub's endpoint when the request names none (its constants.ENDPOINT default).
HUB = "https://huggingface.co"
# Every file of a revision is readable by all (the engines run as a user of their own), written by root.
FILE_MODE = 0o644
READABLE = 0o444
PROGRESS_EVERY_S = 5.0
# How long a fetch waits its turn at a peer that says it is busy or has the file still to come
# (HTTP 503) before the next source: a chain's first hop waits for a whole file from the Hub.
BUSY_WAIT_S = 3600.0
# Files fetched from the Hub at once by a host that others fetch from while it fetches.
IN_ORDER_AT_ONCE = 4
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|gitblob:[0-9a-f]{40})$")


def _digest_of(kind: str, size: int) -> Any:
    """A fresh sha256 (LFS files), or sha1 primed with git's blob header (small files)."""
    if kind == "gitblob":
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(f"blob {size}\0".encode())
        return digest
    return hashlib.sha256()


def _hash(path: str, kind: str, size: int) -> str:
    """``sha256:<hex>`` (LFS files) or ``gitblob:<hex>`` (git's blob id, for small files)."""
    digest = _digest_of(kind, size)
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
    # What a killed run left half-fetched from a peer (no other sync runs: the revision's lock).
    partials = os.path.dirname(partial_path(root, ""))
    for name in os.listdir(partials) if os.path.isdir(partials) else []:
        os.remove(os.path.join(partials, name))
        removed.append(os.path.join(META, "partial", name))
    incomplete = os.path.join(root, ".cache", "huggingface", "download")
    for dirpath, _, filenames in os.walk(incomplete):
        for name in filenames:
            if name.endswith(".incomplete"):
                os.remove(os.path.join(dirpath, name))
                removed.append(os.path.relpath(os.path.join(dirpath, name), root))
    return removed


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


def _open_source(source: dict[str, str], rel: str, key: str | None) -> Any:
    """A readable stream of ``rel`` from a source: a peer's URL, or a local folder (a mount)."""
    if "path" in source:
        return open(inside(source["path"], rel), "rb")
    url = source["url"]
    if not url.startswith("http://"):
        raise ValueError(f"peer URL {url!r} is not http://")
    request = urllib.request.Request(f"{url}/{urllib.parse.quote(rel)}", headers={"Authorization": f"Bearer {key}"})  # noqa: S310 - checked above
    return urllib.request.urlopen(request, timeout=30)  # noqa: S310


class Mismatch(ValueError):
    """The bytes a source gave are not the lock's (``_receive``)."""


class _Sink:
    """Where a file's bytes land as they arrive: hashed and written to its partial file, flushed
    at once (a host fetching from this one relays them as they come). A body resumed with
    ``Range`` goes on where it stopped; a source that sends the whole body again instead (huggingface_hub
    seeks back to 0 and truncates) starts the file and its hash over, and a host relaying it
    waits until the file is past what it sent: the same bytes, or its own hash finds them wrong."""

    def __init__(self, out: BinaryIO, fresh: Callable[[], Any]) -> None:
        self.out, self.fresh = out, fresh
        self.digest, self.got = fresh(), 0

    def write(self, block: bytes) -> int:
        self.digest.update(block)
        self.out.write(block)
        self.out.flush()
        self.got += len(block)
        return len(block)

    def tell(self) -> int:
        return self.got

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if (offset, whence) != (0, os.SEEK_SET):
            raise OSError(f"a body cannot go back to byte {offset} of {self.got}: only to its start")
        self.out.seek(0)
        self.out.truncate()
        self.digest, self.got = self.fresh(), 0
        return 0

    def truncate(self, size: int | None = None) -> int:
        if size not in (None, self.got):
            raise OSError(f"a body cannot be cut to {size} bytes of {self.got}")
        return self.got


def _receive(root: str, rel: str, entry: list[Any], fill: Callable[[_Sink], None]) -> tuple[list[Any], int]:
    """One file into a partial file, hashed as it arrives (``fill`` writes its bytes to the sink,
    from a peer, a mirror or the Hub); moved into place only when it matches the lock. Returns the
    cache entry of the placed file and its size. A failed try leaves no partial file: a host
    relaying it sees it gone and ends its own answer short."""
    size, want = entry
    kind = want.split(":", 1)[0]
    target = inside(root, rel)
    partial = partial_path(root, rel)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial)  # every try a new inode: a relay of an earlier try cannot read this one
    try:
        with open(partial, "wb") as out:
            sink = _Sink(out, lambda: _digest_of(kind, size))
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
    root: str, rel: str, entry: list[Any], source: dict[str, str], key: str | None
) -> tuple[list[Any], int]:
    """``_receive`` of one file from a source: a peer's URL or a local folder."""

    def fill(sink: _Sink) -> None:
        with _open_source(source, rel, key) as answer:
            for block in iter(lambda: answer.read1(1 << 20), b""):
                sink.write(block)

    return _receive(root, rel, entry, fill)


def _fetch_busy(
    root: str, rel: str, entry: list[Any], source: dict[str, str], key: str | None
) -> tuple[list[Any], int]:
    """``_fetch_from``, waiting its turn while the source says it is busy (503 with Retry-After:
    it serves as many hosts at once as it may), for up to ``BUSY_WAIT_S``: a busy source is no
    reason to take the file from the Hub."""
    until = time.monotonic() + BUSY_WAIT_S
    while True:
        try:
            return _fetch_from(root, rel, entry, source, key)
        except urllib.error.HTTPError as exc:
            if exc.code != 503 or time.monotonic() >= until:
                raise
            wait = exc.headers.get("Retry-After", "1") if exc.headers else "1"
            delay = float(wait) if wait.isdigit() else 1.0
            time.sleep(min(delay, 30.0) * random.uniform(0.5, 1.5))  # noqa: S311 - spreads retries, no secret


def _from_peers(
    root: str, lock: dict[str, list[Any]], bad: list[str], req: dict[str, Any], cache: dict[str, list[Any]]
) -> tuple[list[str], dict[str, int], dict[str, str]]:
    """Fetch ``bad`` files from the sources (a local mirror folder, the run's peers), each from
    the first that gives it; returns the files placed, the bytes each source gave, and for each file no source could
    give, the last cause."""
    peers = req.get("peers") or []
    if not peers or not bad:
        return [], {}, {}
    key = None
    if any("url" in p for p in peers):
        with open(req["peer_key_file"], encoding="utf-8") as f:
            key = f.read().strip()
    given: dict[str, int] = {}
    causes: dict[str, str] = {}
    mutex = threading.Lock()

    def one(rel: str) -> str | None:
        for peer in peers:  # in the planner's order: the host before this one in its chain first
            try:
                entry, size = _fetch_busy(root, rel, lock[rel], peer, key)
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
    seconds while files arrive, counting finished files and partial ones."""

    def __init__(self, log: str | None, label: str, root: str, wanted: dict[str, int]) -> None:
        self.log, self.label, self.root, self.wanted = log, label, root, wanted
        self.total = sum(wanted.values())
        self.started = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Progress:
        if self.log and self.wanted:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop.set()
            self.thread.join()
            self._write(final=True)

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

    def _write(self, final: bool = False) -> None:
        done, seconds = self._done(), max(time.monotonic() - self.started, 1e-6)
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
        while not self.stop.wait(PROGRESS_EVERY_S):
            self._write()


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


def _request(argv: list[str]) -> dict[str, Any]:
    if len(argv) == 3 and argv[1] == "--config":
        with open(argv[2], encoding="utf-8") as f:
            data: dict[str, Any] = json.load(f)
            return data
    loaded: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(argv[1])))
    return loaded


def check_request(req: dict[str, Any]) -> None:
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
            status = getattr(getattr(gated, "response", None), "status_code", None)
            line = gated_line(req["repo"], req.get("endpoint") or HUB, status)
            _fail({"error": "gated", "status": status, "message": line}, f"{label}: {where}: {line}", 5)
        exc = chain[-1]
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        _fail(
            {"error": "hub", "type": type(exc).__name__, "message": first},
            f"{label}: {where}: {type(exc).__name__}: {first}",
            5,
        )


def _remove(root: str, names: list[str]) -> None:
    """Remove ``<root>/<name>`` for each name: a symlink itself, never what it points at."""
    for rel in names:
        path = inside(root, rel)
        if os.path.lexists(path):
            os.remove(path)


def _from_hub(
    req: dict[str, Any],
    *,
    root: str,
    lock: dict[str, list[Any]],
    bad: list[str],
    cache: dict[str, list[Any]],
    workers: int,
) -> tuple[list[str], list[str]]:
    """Fetch ``bad`` from the Hub, retrying mismatches alone; returns (fetched, still bad)."""
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if req.get("endpoint"):
        os.environ["HF_ENDPOINT"] = req["endpoint"]
    if req.get("token_file") and os.path.exists(req["token_file"]):
        os.environ["HF_TOKEN_PATH"] = req["token_file"]
    # Imported after the environment above is set (huggingface_hub reads it at import), and only
    # when the Hub is needed at all.
    from huggingface_hub import hf_hub_download, snapshot_download  # noqa: PLC0415
    from huggingface_hub.utils import logging as hf_logging  # noqa: PLC0415

    # Its retry chatter would bury the one line that says what failed.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    fetched: list[str] = []
    _remove(root, bad)
    if req.get("in_order"):
        # Hosts fetch from this one as its files arrive: files in the lock's order (theirs too),
        # IN_ORDER_AT_ONCE at a time (one alone would leave the link idle between files), each
        # streamed into its partial file, where this host's peer service relays it at once (a
        # whole file sent in one burst would fill the link that carries this host's own
        # acknowledgements), and recorded verified as soon as it is placed. huggingface_hub's own
        # GET (``http_get``, what ``hf_hub_download`` runs after its metadata request) follows the
        # Hub's redirect, dropping the token on another origin; a file that does not match the
        # lock is left for the retries below.
        from huggingface_hub import constants, hf_hub_url  # noqa: PLC0415
        from huggingface_hub.file_download import http_get  # noqa: PLC0415
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # noqa: PLC0415

        # Bytes as the network gives them (up to 64 KiB a read), not gathered by 10 MiB first:
        # the next host receives them from this one's partial file at once.
        constants.DOWNLOAD_CHUNK_SIZE = None  # type: ignore[assignment]
        headers = build_hf_headers()
        mutex = threading.Lock()

        def one(rel: str) -> None:
            url = hf_hub_url(req["repo"], rel, revision=req["revision"], endpoint=req.get("endpoint") or None)
            size = int(lock[rel][0])
            try:
                entry, _ = _receive(root, rel, lock[rel],
                                    lambda sink: http_get(url, sink, headers=dict(headers), expected_size=size))  # type: ignore[arg-type]  # fmt: skip
            except Mismatch:
                return  # not the lock's bytes: fetched again below
            with mutex:
                fetched.append(rel)
                cache[rel] = entry
                _save_cache(root, lock, cache)

        with ThreadPoolExecutor(max_workers=IN_ORDER_AT_ONCE) as pool:
            list(pool.map(one, sorted(bad)))
    else:
        # Patterns are globs: escaped, each matches its one name, whatever the Hub lists beside it.
        patterns = [glob.escape(rel) for rel in bad]
        snapshot_download(req["repo"], revision=req["revision"], local_dir=root, allow_patterns=patterns)
        fetched += bad
    bad = _verify(root, lock, cache, workers)
    for _ in range(int(req.get("retries", 2))):
        if not bad:
            break
        _remove(root, bad)
        for rel in bad:
            inside(root, rel)  # huggingface_hub writes <root>/<rel>
            hf_hub_download(req["repo"], rel, revision=req["revision"], local_dir=root, force_download=True)
        fetched += bad
        bad = _verify(root, lock, cache, workers)
    return fetched, bad


def sync(req: dict[str, Any]) -> None:
    root, lock = req["dir"], req["lock"]
    started = time.monotonic()
    scrub = bool(req.get("scrub"))
    os.makedirs(root, exist_ok=True)
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
        _save_json(root, "scrub.json", {"time": time.time(), "checked": len(lock), "corrupted": corrupted,
                                         "repair": bool(req.get("repair"))})  # fmt: skip
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
    with Progress(req.get("progress_log"), label, root, {r: lock[r][0] for r in bad}):
        placed, from_peers, peer_causes = _from_peers(root, lock, bad, req, cache)
        bad = [r for r in bad if r not in placed]
        if bad:
            fetched, bad = _from_hub(req, root=root, lock=lock, bad=bad, cache=cache, workers=workers)
    _save_cache(root, lock, cache)
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
        Progress(req.get("progress_log"), label, root, {}).note(
            f"{len(placed)} files from peers ({given or 'none'}), {len(set(fetched))} files ({hub_bytes} bytes) "
            f"from {req.get('endpoint') or 'the Hub'}"
        )
    if scrub and corrupted:
        _save_json(root, "scrub.json", {"time": time.time(), "checked": len(lock), "corrupted": corrupted,
                                         "repaired": sorted(corrupted)})  # fmt: skip
        print(f"kimi-deploy: scrub: re-fetched {len(corrupted)} corrupted files", file=sys.stderr)
    print(json.dumps({
        "ok": True, "fetched": sorted(set(fetched)), "from_peers": from_peers, "peer_failures": peer_causes,
        "linked": len(linked), "removed": removed, "corrupted": sorted(corrupted),
        "seconds": round(time.monotonic() - started, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
