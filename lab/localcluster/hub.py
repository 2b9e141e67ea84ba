"""A fake Hugging Face Hub: a real HTTP server (stdlib only) that the unmodified huggingface_hub client talks to.

It serves every repo that ``localcluster.hub_repo`` writes under a root directory (``objects/<sha256>`` plus
``repos/<repo_id>/{refs.json,commits/<sha>.json}``; ``localcluster.hub_content`` writes the cluster's:
``localcluster.tiny_model``'s, ``localcluster.tiny_llama``'s and ``localcluster.needle_llama``'s), models only,
read only, no token needed (an ``Authorization`` header is accepted and never logged). Endpoints, as
huggingface_hub 2.x calls them:

* ``HEAD|GET /{repo_id}/resolve/{rev}/{path}``: ``X-Repo-Commit``, quoted ``ETag`` (the git blob id), ``Range``
  (206/416). LFS files answer 302 to ``/_cdn/lfs/{sha256}?repo=&commit=&path=`` on the CDN, another
  origin (the same address, ``CDN_PORT_OFFSET`` ports up: ``HubServer.cdn``), as the Hub sends its large
  files to a CDN host of its own, with ``X-Linked-Etag`` (the sha256), ``X-Linked-Size``, and the Xet
  headers the Hub adds for a file stored in Xet (and ``xetHash`` in its tree entries): ``X-Xet-Hash``
  and ``Link: <{endpoint}/api/models/{repo_id}/xet-read-token/{commit}>; rel="xet-auth"``
  (huggingface_hub 2.4.0 ``utils/_xet.py`` ``parse_xet_file_data_from_response`` reads both; the hash
  here is derived from the sha256, not Xet's chunk hash: nothing in the cluster speaks Xet, and
  ``xet-read-token`` answers 501, counted, so a client taking the Xet path fails loudly).
  huggingface_hub takes the metadata from the 302 itself and does not follow it on its HEAD
  (``utils/_http.py`` ``_httpx2_follow_hub_redirects_with_backoff``), and sends no token to another
  origin (``file_download._get_metadata_or_catch_error``); the CDN answers any request for its files,
  counts the ones that carry ``Authorization`` (``cdn_authorized``: a token that left the Hub), and
  nothing else.
* ``GET /api/whoami-v2``: who the request's token belongs to, ``{"type": "user", "name": ...}`` (a
  stand-in account; the deploy reads only the status), 401 without a token or with a revoked one.
* ``GET /api/models/{repo_id}`` and ``.../revision/{rev}`` (``?blobs=true`` adds sizes and LFS info to siblings).
* ``GET /api/models/{repo_id}/tree/{rev}[/{path}]?recursive=&expand=``, paged (``page_size`` entries, ``Link:
  <...>; rel="next"``, later pages pinned to the resolved commit).
* ``POST /api/models/{repo_id}/paths-info/{rev}`` (form or JSON ``paths``, ``expand``).
* ``GET /api/models/{repo_id}/refs`` and ``GET /api/models/{repo_id}/commits/{rev}`` (paged).
* Errors carry ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound`` with 404, which the
  client turns into RepositoryNotFoundError / RevisionNotFoundError / RemoteEntryNotFoundError.
* ``GET /_stats``: ``{"requests_total", "requests": {"GET resolve": n, ...}, "downloads": {path: bodies
  started}, "bytes": {path: body bytes sent}, "files": {"HEAD path": n, "GET path": n}, "starts": {path:
  [first byte of each body]}, "cdn_authorized": n}``; paths are paths in the repo (``files`` counts their
  ``/resolve`` and CDN requests alike, failed ones too); ``/_stats`` calls are not counted.
  ``POST /_stats/reset`` zeroes it.

Faults: ``<root>/faults.json`` is read on every request (absent: none; write it with ``write_faults``).
Keys (unknown keys are an error, answered 500):

* ``"down": true``: 503 on everything but ``/_stats``; ``"retry_after": N`` adds ``Retry-After: N``. A
  body being sent slowly (``slow_bytes_per_s``) when the Hub goes down stops there, its connection
  closed short of its length, as a server going away leaves its transfers.
* ``"corrupt": [glob, ...]``: matching paths are served at full size with every byte of the second half
  XOR 0xFF (the safetensors header stays readable; only a checksum tells). Metadata stays truthful.
* ``"truncate": {glob: N}``: each body of a matching path stops after N bytes and the connection is closed
  (a dropped transfer); ``"truncate_times": K`` limits that to the first K bodies per path since faults.json
  last changed. huggingface_hub retries, resuming with ``Range`` only from whole 10 MiB chunks it received:
  below that it starts over, so with no ``truncate_times`` a small file never completes (after 5 retries).
* ``"revoked": [token, ...]``: tokens no longer valid (expired or revoked). A request to the Hub carrying
  one answers 401 ``{"error": "Invalid credentials in Authorization header"}``, whatever it asks for,
  public repositories too, as the Hub does for a bad token (``/api/whoami-v2``: huggingface/huggingface_hub#3368;
  ``/resolve`` of a public repository: deepbeepmeep/Wan2GP#455; model info: Comfy-Org/ComfyUI#9415).
* ``"whole": [glob, ...]``: a ``Range`` of a matching path is ignored and the whole body answered
  200, as RFC 9110 lets a server do (section 14.2: a server may ignore Range) and as a CDN does for a
  compressed object (huggingface_hub 2.4.0 ``file_download.http_get``: "the server ignored our Range
  header (e.g. CloudFront with Accept-Encoding: gzip)").
* ``"slow_bytes_per_s": N``: every file body is sent at about N bytes per second.
* ``"overlong": {glob: N}``: each body of a matching path goes on N zero bytes past the file's end
  (or past the end of the range asked for), with no ``Content-Length``: the answer ends only when
  the connection closes, as a hostile or broken server or CDN streams past a file's size.
* ``"drip": {glob: S}``: each body of a matching path is sent one byte every S seconds (S > 0): a
  source that never stalls long enough for a read timeout, and never ends.
* ``"gated": {repo_id: [token, ...]}``: the repository is gated and only those tokens' accounts have
  been granted access. Its files (``/resolve``) then answer as the Hub answers a gated repository:
  ``X-Error-Code: GatedRepo`` with 401 when the request carries no ``Authorization: Bearer``
  token, 403 when the token is not one granted, with the Hub's message (huggingface_hub 2.4.0
  ``utils/_http.py`` raises ``GatedRepoError`` for that code, and says the Hub sends 401 for a
  gated repository without a token; the 401 message as users quote it, bytedance/DreamO#8; a 403
  for a token without access, huggingface/transformers#31367). Its metadata and listing stay
  open: "it's now possible to list gated files with the API" (the Hub's team,
  huggingface/huggingface.js#945).
* ``"fail": [rule, ...]``: count-limited faults of one file and method, each rule
  ``{"path": glob, "method": "HEAD"|"GET", "times": K, ...}`` and one of ``"status": N`` (the request is
  answered N instead, ``"retry_after": S`` adding ``Retry-After: S``, ``"headers": {name: value}``
  adding those headers as given, over any the status brings: a ``Retry-After`` that is no number
  of seconds, a ``RateLimit`` reset thousands of digits long) or ``"reset_at": F`` (a GET body
  stops after that fraction of the file, 0 < F < 1, and the connection is reset: RST, as a dropped
  link or a restarted load balancer leaves it). A rule applies to the requests of its path, on
  ``/resolve`` and the CDN alike, the first K of them since faults.json last changed. A 429 carries
  the Hub's rate-limit headers: ``RateLimit: "resolvers";r=0;t=S`` and ``RateLimit-Policy: "fixed
  window";"resolvers";q=3000;w=300`` (the Hub limits ``/resolve`` URLs in their own "resolvers"
  bucket over 5-minute windows, https://huggingface.co/docs/hub/rate-limits; the header format is the
  one huggingface_hub 2.4.0 parses, ``utils/_http.py`` ``parse_ratelimit_headers``).

Run: ``python -m localcluster.hub --bind 127.0.0.1 --port 8088 --root DIR``, or in-process ``serve(root)``,
which returns a started ``HubServer`` (``.url``, ``.stats``, ``.stop()``). Bind loopback or the test bridge
address only. The access log (one line per request, stderr) has method, path without query, status,
bytes and time: never headers, so never a token.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Self, TextIO, cast
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from localcluster.background_server import BackgroundServer

DEFAULT_PAGE_SIZE = 50
FAULTS_FILE = "faults.json"
# The CDN's port beside a hub started on a port of its own (the cluster's): known to whoever shapes
# or watches the Hub's traffic. A hub on a free port (0) has its CDN on another free port.
CDN_PORT_OFFSET = 100

_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_HOST = re.compile(r"^([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?$")
# Words that follow a repo id in API paths; a second path segment that is one of them is not part of the id.
_API_SUBPATHS = {"revision", "tree", "paths-info", "refs", "commits", "resolve", "xet-read-token"}
_CHUNK = 1 << 20
_MAX_BODY = 1 << 20
_INVERT = bytes(b ^ 0xFF for b in range(256))
_TRUE = {"1", "true", "True", "yes"}


# ---- faults ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Faults:
    """The parsed ``faults.json``; the default is "no faults"."""

    down: bool = False
    retry_after: int | None = None
    corrupt: tuple[str, ...] = ()
    truncate: tuple[tuple[str, int], ...] = ()
    truncate_times: int | None = None
    slow_bytes_per_s: int | None = None
    gated: tuple[tuple[str, tuple[str, ...]], ...] = ()
    fail: tuple[FailRule, ...] = ()
    whole: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    overlong: tuple[tuple[str, int], ...] = ()
    drip: tuple[tuple[str, float], ...] = ()

    def granted(self, repo_id: str) -> tuple[str, ...] | None:
        """The tokens granted access to ``repo_id`` when it is gated (None: it is not)."""
        return next((tokens for repo, tokens in self.gated if repo == repo_id), None)

    def corrupts(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, g) for g in self.corrupt)

    def ignores_range(self, path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, g) for g in self.whole)

    def truncation(self, path: str) -> int | None:
        return next((n for g, n in self.truncate if fnmatch.fnmatchcase(path, g)), None)

    def overlong_by(self, path: str) -> int | None:
        """The bytes a body of ``path`` goes on past its end (None: it ends where it should)."""
        return next((n for g, n in self.overlong if fnmatch.fnmatchcase(path, g)), None)

    def drip_s(self, path: str) -> float | None:
        """The seconds between the bytes of a body of ``path`` (None: it is not dripped)."""
        return next((s for g, s in self.drip if fnmatch.fnmatchcase(path, g)), None)


@dataclass(frozen=True)
class FailRule:
    """One ``"fail"`` rule of faults.json: the first ``times`` requests of ``method`` for a path
    matching ``path`` get ``status`` instead of their answer, or have their body reset at ``reset_at``."""

    path: str
    method: str
    times: int
    status: int | None = None
    retry_after: int | None = None
    reset_at: float | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def matches(self, method: str, path: str) -> bool:
        return method == self.method and fnmatch.fnmatchcase(path, self.path)


def _fail_rules(value: Any) -> tuple[FailRule, ...]:
    """The ``"fail"`` list, checked; ValueError names the rule and what is wrong with it."""
    if not isinstance(value, list):
        raise ValueError(f"{FAULTS_FILE}: fail must be a list of rules")
    rules = []
    for n, rule in enumerate(value):
        where = f"{FAULTS_FILE}: fail[{n}]"
        if not isinstance(rule, dict):
            raise ValueError(f"{where}: expected an object")
        unknown = set(rule) - {"path", "method", "times", "status", "retry_after", "reset_at", "headers"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        path, method, times = rule.get("path"), rule.get("method"), rule.get("times", 1)
        status, retry_after, reset_at = rule.get("status"), rule.get("retry_after"), rule.get("reset_at")
        if not isinstance(path, str) or method not in ("HEAD", "GET"):
            raise ValueError(f"{where}: path must be a glob and method HEAD or GET")
        if not (isinstance(times, int) and times >= 1):
            raise ValueError(f"{where}: times must be a positive integer")
        if (status is None) == (reset_at is None):
            raise ValueError(f"{where}: give one of status and reset_at")
        if status is not None and not (isinstance(status, int) and 400 <= status <= 599):
            raise ValueError(f"{where}: status must be an HTTP error status (400 to 599)")
        if reset_at is not None and not (isinstance(reset_at, float) and 0 < reset_at < 1 and method == "GET"):
            raise ValueError(f"{where}: reset_at must be a fraction between 0 and 1, of a GET")
        if retry_after is not None and not (isinstance(retry_after, int) and retry_after >= 0 and status):
            raise ValueError(f"{where}: retry_after must be a non-negative integer, with a status")
        headers = rule.get("headers", {})
        sendable = isinstance(headers, dict) and all(_raw_header(k, v) for k, v in headers.items())
        if not sendable or (headers and not status):
            raise ValueError(f"{where}: headers must map header names to latin-1 values on one line, with a status")
        rules.append(FailRule(path, method, times, status, retry_after, reset_at, tuple(headers.items())))
    return tuple(rules)


def _raw_header(name: Any, value: Any) -> bool:
    """Whether ``name: value`` can be sent as given: a token name, a latin-1 value on one line."""
    if not (isinstance(name, str) and isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9-]+", name)):
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return not any(c in value for c in "\r\n\0")


def read_faults_text(root: Path) -> str:
    """The raw ``<root>/faults.json`` ("" when absent)."""
    try:
        return (Path(root) / FAULTS_FILE).read_text()
    except FileNotFoundError:
        return ""


def parse_faults(text: str) -> Faults:
    """Parse faults.json text; raises ValueError when it is malformed (the server then answers 500)."""
    if not text.strip():
        return Faults()
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{FAULTS_FILE}: expected a JSON object")
    known = {
        "down",
        "retry_after",
        "corrupt",
        "truncate",
        "truncate_times",
        "slow_bytes_per_s",
        "gated",
        "fail",
        "whole",
        "revoked",
        "overlong",
        "drip",
    }
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{FAULTS_FILE}: unknown keys {sorted(unknown)}")
    corrupt = data.get("corrupt", [])
    truncate = data.get("truncate", {})
    slow = data.get("slow_bytes_per_s")
    retry_after = data.get("retry_after")
    times = data.get("truncate_times")
    whole, revoked = data.get("whole", []), data.get("revoked", [])
    for key, globs in (("corrupt", corrupt), ("whole", whole), ("revoked", revoked)):
        if not (isinstance(globs, list) and all(isinstance(g, str) for g in globs)):
            raise ValueError(f"{FAULTS_FILE}: {key} must be a list of strings")
    overlong, drip = data.get("overlong", {}), data.get("drip", {})
    for key, counts in (("truncate", truncate), ("overlong", overlong)):
        if not (isinstance(counts, dict) and all(isinstance(n, int) and n >= 0 for n in counts.values())):
            raise ValueError(f"{FAULTS_FILE}: {key} must map globs to byte counts")
    if not (isinstance(drip, dict) and all(isinstance(s, int | float) and s > 0 for s in drip.values())):
        raise ValueError(f"{FAULTS_FILE}: drip must map globs to seconds between bytes")
    if slow is not None and not (isinstance(slow, int) and slow > 0):
        raise ValueError(f"{FAULTS_FILE}: slow_bytes_per_s must be a positive integer")
    gated = data.get("gated", {})
    if not (
        isinstance(gated, dict)
        and all(isinstance(t, list) and all(isinstance(x, str) for x in t) for t in gated.values())
    ):
        raise ValueError(f"{FAULTS_FILE}: gated must map repository ids to lists of tokens")
    for key, value in (("retry_after", retry_after), ("truncate_times", times)):
        if value is not None and not (isinstance(value, int) and value >= 0):
            raise ValueError(f"{FAULTS_FILE}: {key} must be a non-negative integer")
    return Faults(
        down=bool(data.get("down", False)),
        retry_after=retry_after,
        corrupt=tuple(corrupt),
        truncate=tuple(truncate.items()),
        truncate_times=times,
        slow_bytes_per_s=slow,
        gated=tuple((repo, tuple(tokens)) for repo, tokens in gated.items()),
        fail=_fail_rules(data.get("fail", [])),
        whole=tuple(whole),
        revoked=tuple(revoked),
        overlong=tuple(overlong.items()),
        drip=tuple((g, float(s)) for g, s in drip.items()),
    )


def write_faults(root: Path, faults: dict[str, Any] | None) -> None:
    """Set the faults (``None`` or ``{}`` clears them); atomic, so a request never reads half a file."""
    path = Path(root) / FAULTS_FILE
    if not faults:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{FAULTS_FILE}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(faults))
    os.replace(tmp, path)


# ---- counters -------------------------------------------------------------------------------------


@dataclass
class Stats:
    """Request and byte counters, safe to update from every handler thread."""

    requests: Counter[str] = field(default_factory=Counter)
    downloads: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    files: Counter[str] = field(default_factory=Counter)
    starts: dict[str, list[int]] = field(default_factory=dict)
    cdn_authorized: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, counter: Counter[str], key: str, n: int = 1) -> None:
        with self.lock:
            counter[key] += n

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests_total": sum(self.requests.values()),
                "requests": dict(sorted(self.requests.items())),
                "downloads": dict(sorted(self.downloads.items())),
                "bytes": dict(sorted(self.sent.items())),
                "files": dict(sorted(self.files.items())),
                "starts": {path: list(firsts) for path, firsts in sorted(self.starts.items())},
                "cdn_authorized": self.cdn_authorized,
            }

    def authorized_at_cdn(self) -> None:
        with self.lock:
            self.cdn_authorized += 1

    def started(self, path: str, first: int) -> None:
        with self.lock:
            self.downloads[path] += 1
            self.starts.setdefault(path, []).append(first)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.downloads.clear()
            self.sent.clear()
            self.files.clear()
            self.starts.clear()
            self.cdn_authorized = 0


# ---- repos ----------------------------------------------------------------------------------------


class HubError(Exception):
    """An error answer: HTTP status, the Hub's ``X-Error-Code`` (if any) and a message."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}


class Repo:
    """One repo under the root: refs are re-read on each call (they may move), manifests are cached
    (a commit id names its content)."""

    def __init__(self, root: Path, repo_id: str, cache: dict[str, dict[str, Any]]) -> None:
        self.repo_id = repo_id
        self.dir = root / "repos" / repo_id
        self._cache = cache

    def refs(self) -> dict[str, dict[str, str]]:
        data: dict[str, dict[str, str]] = json.loads((self.dir / "refs.json").read_text())
        return data

    def commit(self, sha: str) -> dict[str, Any]:
        key = f"{self.repo_id}@{sha}"
        manifest = self._cache.get(key)
        if manifest is None:
            manifest = json.loads((self.dir / "commits" / f"{sha}.json").read_text())
            self._cache[key] = manifest
        return manifest

    def resolve(self, rev: str) -> str:
        """Commit id of a full commit id, branch, tag, ``refs/heads/X`` or ``refs/tags/X``."""
        refs = self.refs()
        branches, tags = refs.get("branches", {}), refs.get("tags", {})
        if _SHA1.match(rev) and (self.dir / "commits" / f"{rev}.json").is_file():
            return rev
        for name, table in ((rev, branches), (rev, tags)):
            if name in table:
                return table[name]
        if rev.startswith("refs/heads/") and rev[11:] in branches:
            return branches[rev[11:]]
        if rev.startswith("refs/tags/") and rev[10:] in tags:
            return tags[rev[10:]]
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def history(self, sha: str) -> list[dict[str, Any]]:
        """Commits from ``sha`` back along first parents, newest first."""
        out = [self.commit(sha)]
        while out[-1]["parents"]:
            out.append(self.commit(out[-1]["parents"][0]))
        return out

    def last_commit(self, sha: str, path: str, is_dir: bool) -> dict[str, Any]:
        """The newest commit (first-parent walk) that changed ``path``, as the tree API's ``lastCommit``."""
        table = "trees" if is_dir else "files"

        def oid(m: dict[str, Any]) -> Any:
            value = m[table].get(path)
            return value if is_dir or value is None else value["oid"]

        current = self.commit(sha)
        while current["parents"]:
            parent = self.commit(current["parents"][0])
            if oid(parent) != oid(current):
                break
            current = parent
        return {"id": current["id"], "title": current["title"], "date": _iso(current["time"])}


def _split_api(rest: list[str]) -> tuple[str, list[str]]:
    """``(repo_id, rest)`` of the segments after ``/api/models/``: ids are ``name`` or ``org/name``."""
    if len(rest) >= 2 and rest[1] not in _API_SUBPATHS:
        return "/".join(rest[:2]), rest[2:]
    return rest[0], rest[1:]


def _iso(when: int) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _directories(files: dict[str, Any]) -> set[str]:
    return {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}


def _git_order(path: str, is_dir: bool) -> str:
    # git sorts a directory as if its name ended with "/", which also puts it right before its content.
    return path + "/" if is_dir else path


def _xet_hash(sha256: str) -> str:
    """The Xet hash the Hub gives an LFS file in its tree entries and ``X-Xet-Hash``: here a stand-in
    derived from its sha256, not Xet's chunk hash (nothing in the cluster speaks Xet)."""
    return hashlib.sha256(f"xet:{sha256}".encode()).hexdigest()


def _header_safe(text: str) -> str:
    """Printable ASCII only: messages echo request paths, which must not inject headers."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:300]


def _range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(first, last)`` for one satisfiable ``bytes=`` range, None for no (or an ignorable) Range header.

    Raises HubError 416 for a range that starts past the end.
    """
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if m is None or (not m.group(1) and not m.group(2)):
        return None  # several ranges or bad syntax: RFC 9110 lets us answer the whole file
    if not m.group(1):
        suffix = int(m.group(2))
        if suffix == 0 or size == 0:
            raise HubError(416, None, "Range Not Satisfiable")
        return max(0, size - suffix), size - 1
    first = int(m.group(1))
    last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    if first >= size or first > last:
        raise HubError(416, None, "Range Not Satisfiable")
    return first, last


# ---- HTTP -----------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: huggingface_hub pools connections
    server_version = "localcluster-hub/1"
    timeout = 120  # idle keep-alive connections end on their own

    _status = 0
    _bytes = 0

    @property
    def hub(self) -> HubServer:
        server = self.server
        return server.hub if isinstance(server, _Cdn) else cast(HubServer, server)

    @property
    def at_cdn(self) -> bool:
        return isinstance(self.server, _Cdn)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # The stdlib logs each request (with no timing) and errors on its own: one compact line per request
    # is written by ``_dispatch`` instead.
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass

    def log_message(self, format: str, *args: Any) -> None:
        self.hub.log(f"{self.client_address[0]} {format % args}")

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status = code
        super().send_response(code, message)

    # -- plumbing --

    def _dispatch(self, method: str) -> None:
        started = time.monotonic()
        self._status, self._bytes = 0, 0
        url = urlsplit(self.path)
        segments = [unquote(s) for s in url.path.split("/")[1:]]
        query = parse_qs(url.query, keep_blank_values=True)
        try:
            body = self._read_body()
            if segments[:1] == ["_stats"]:
                self._stats(method, segments)
                return
            kind = self._kind(segments)
            self.hub.stats.count(self.hub.stats.requests, f"{method} {kind}")
            try:
                faults = self.hub.faults()
            except (OSError, ValueError) as exc:
                raise HubError(500, None, str(exc)) from None
            if faults.down:
                extra = {} if faults.retry_after is None else {"Retry-After": str(faults.retry_after)}
                raise HubError(503, None, "Service Unavailable (fault injected)", extra)
            self._route(method, kind, segments, query=query, body=body, faults=faults)
        except HubError as exc:
            self._error(method, exc)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a bad manifest or object must answer 500, not kill the thread
            if self._status:  # the answer has started: all the client can get is a short body
                self.close_connection = True
            else:
                self._error(method, HubError(500, None, f"Internal error: {type(exc).__name__}: {exc}"))
        finally:
            elapsed = (time.monotonic() - started) * 1000
            self.hub.log(f"{self.client_address[0]} {method} {url.path} {self._status} {self._bytes}B {elapsed:.0f}ms")

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise HubError(400, None, "Bad Content-Length") from None
        if length > _MAX_BODY:
            self.close_connection = True
            raise HubError(413, None, "Request body too large")
        return self.rfile.read(length) if length > 0 else b""

    @staticmethod
    def _kind(segments: list[str]) -> str:
        if segments[:2] == ["_cdn", "lfs"]:
            return "cdn"
        if segments[:2] == ["api", "models"] and len(segments) > 2:
            tail = _split_api(segments[2:])[1]
            word = tail[0] if tail else "revision"
            return {"revision": "model_info", "paths-info": "paths_info", "xet-read-token": "xet_token"}.get(word, word)
        if "resolve" in segments[1:3]:
            return "resolve"
        if segments == ["api", "whoami-v2"]:
            return "whoami"
        return "other"

    def _origin(self) -> str:
        """Scheme and authority the client used (so redirects and page links work on any address)."""
        host = self.headers.get("Host", "")
        return f"http://{host}" if _HOST.match(host) else self.hub.url

    def _cdn_origin(self) -> str:
        """The CDN's origin on the address the client used: the CDN's own port."""
        name = urlsplit(self._origin()).hostname or "127.0.0.1"
        name = f"[{name}]" if ":" in name else name
        return f"http://{name}:{self.hub.cdn.port}"

    def _send(self, status: int, headers: dict[str, str], body: bytes, method: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD" and body:
            self.wfile.write(body)
            self._bytes += len(body)

    def _json(self, method: str, data: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(data).encode()
        self._send(200, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, body, method)

    def _error(self, method: str, exc: HubError) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": _header_safe(str(exc))}
        headers |= exc.headers
        if exc.code:
            headers["X-Error-Code"] = exc.code
        self._send(exc.status, headers, json.dumps({"error": str(exc)}).encode(), method)

    # -- routes --

    def _stats(self, method: str, segments: list[str]) -> None:
        if segments == ["_stats"] and method in ("GET", "HEAD"):
            self._json(method, self.hub.stats.snapshot())
        elif segments == ["_stats", "reset"] and method == "POST":
            self.hub.stats.reset()
            self._json(method, {"ok": True})
        else:
            raise HubError(404, None, "Not Found")

    def _route(
        self, method: str, kind: str, segments: list[str], *, query: dict[str, list[str]], body: bytes, faults: Faults
    ) -> None:
        token = self._token()
        if not self.at_cdn and token is not None and token in faults.revoked:
            raise HubError(401, None, "Invalid credentials in Authorization header")
        if kind == "whoami" and method == "GET" and not self.at_cdn:
            if token is None:
                raise HubError(401, None, "Invalid credentials in Authorization header")
            self._json(method, {"type": "user", "name": "kimi-tester", "auth": {"type": "access_token"}})
            return
        if self.at_cdn or kind == "cdn":
            # The CDN is an origin of its own: it serves its files and nothing else, and the Hub none of them.
            if not (self.at_cdn and kind == "cdn" and len(segments) == 3 and method in ("GET", "HEAD")):
                raise HubError(404, None, "Not Found")
            if self.headers.get("Authorization"):
                self.hub.stats.authorized_at_cdn()
            self._file_request(method, query.get("path", [segments[2]])[0], faults)
            self._cdn(method, segments[2], query, faults)
        elif segments[:2] == ["api", "models"] and len(segments) >= 3:
            self._api(method, segments[2:], query, body)
        elif kind == "resolve" and method in ("GET", "HEAD"):
            at = segments.index("resolve", 1)
            if len(segments) < at + 3:
                raise HubError(404, None, "Not Found")
            repo_id = "/".join(segments[:at])
            repo = self._repo(repo_id)
            self._file_request(method, "/".join(segments[at + 2 :]), faults)
            self._gate(repo_id, faults)
            self._resolve(method, repo, segments[at + 1], "/".join(segments[at + 2 :]), faults)
        elif segments[:1] in (["datasets"], ["spaces"], ["kernels"]) or segments[:2] in (
            ["api", "datasets"],
            ["api", "spaces"],
        ):
            raise HubError(404, "RepoNotFound", "Repository not found (this hub serves models only)")
        else:
            raise HubError(404, None, "Not Found")

    def _repo(self, repo_id: str) -> Repo:
        parts = repo_id.split("/")
        if not (1 <= len(parts) <= 2 and all(_NAME.match(p) and ".." not in p for p in parts)):
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_id}")
        repo = Repo(self.hub.root, repo_id, self.hub.manifests)
        if not (repo.dir / "refs.json").is_file():
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_id}")
        return repo

    def _resolve(self, method: str, repo: Repo, rev: str, path: str, faults: Faults) -> None:
        sha = repo.resolve(rev)
        entry = repo.commit(sha)["files"].get(path)
        if entry is None:
            # X-Repo-Commit lets the client remember (in its cache) that the file does not exist there.
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if entry["lfs"] is None:
            self._blob(method, entry["sha256"], path, headers=headers, faults=faults, disposition="inline")
            return
        target = urlencode({"repo": repo.repo_id, "commit": sha, "path": path})
        token_route = f"{self._origin()}/api/models/{repo.repo_id}/xet-read-token/{sha}"
        headers |= {
            "Location": f"{self._cdn_origin()}/_cdn/lfs/{entry['sha256']}?{target}",
            "X-Linked-Etag": f'"{entry["sha256"]}"',
            "X-Linked-Size": str(entry["size"]),
            "X-Xet-Hash": _xet_hash(entry["sha256"]),
            "Link": f'<{token_route}>; rel="xet-auth"',
        }
        self._send(302, headers, b"", method)

    def _file_request(self, method: str, path: str, faults: Faults) -> None:
        """Count a request of a file; answer it with the error of a ``"fail"`` rule whose turn it is."""
        self.hub.stats.count(self.hub.stats.files, f"{method} {path}")
        rule = self.hub.take_rule(faults, method, path, body=False)
        if rule is None or rule.status is None:
            return
        headers = {} if rule.retry_after is None else {"Retry-After": str(rule.retry_after)}
        if rule.status == 429:
            reset = rule.retry_after if rule.retry_after is not None else 60
            headers |= {
                "RateLimit": f'"resolvers";r=0;t={reset}',
                "RateLimit-Policy": '"fixed window";"resolvers";q=3000;w=300',
            }
        if rule.status == 401:  # as the Hub answers a token it no longer takes (see "revoked")
            raise HubError(401, None, "Invalid credentials in Authorization header", headers)
        headers |= dict(rule.headers)
        phrase = {429: "Too Many Requests", 503: "Service Unavailable"}.get(rule.status, "Error")
        raise HubError(rule.status, None, f"{phrase} (fault injected)", headers)

    def _token(self) -> str | None:
        """The request's ``Authorization: Bearer`` token, if it has one."""
        words = (self.headers.get("Authorization") or "").split()
        return words[1] if len(words) == 2 and words[0].lower() == "bearer" else None

    def _gate(self, repo_id: str, faults: Faults) -> None:
        """Refuse a gated repository's files as the Hub does (see ``"gated"`` in the module docstring)."""
        granted = faults.granted(repo_id)
        if granted is None:
            return
        token = self._token()
        if token is None:
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it "
                "and be authenticated to access it. Please log in.",
            )
        if token not in granted:
            raise HubError(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the "
                f"authorized list. Visit {self._origin()}/{repo_id} to ask for access.",
            )

    def _cdn(self, method: str, oid: str, query: dict[str, list[str]], faults: Faults) -> None:
        if not _SHA256.match(oid) or not (self.hub.root / "objects" / oid).is_file():
            raise HubError(404, None, "NoSuchKey")
        path = query.get("path", [oid])[0]
        commit = query.get("commit", [""])[0]
        headers = {"ETag": f'"{oid}"', "Accept-Ranges": "bytes"}
        if _SHA1.match(commit):
            headers["X-Repo-Commit"] = commit
        self._blob(method, oid, path, headers=headers, faults=faults, disposition="attachment")

    def _blob(
        self, method: str, oid: str, path: str, *, headers: dict[str, str], faults: Faults, disposition: str
    ) -> None:
        """Send object ``oid`` as file ``path``, honouring Range and the faults that apply to ``path``."""
        obj = self.hub.root / "objects" / oid
        size = obj.stat().st_size
        try:
            span = _range(None if faults.ignores_range(path) else self.headers.get("Range"), size)
        except HubError:
            self._send(416, {"Content-Range": f"bytes */{size}", **headers}, b"", method)
            return
        first, last = span if span is not None else (0, size - 1)
        length = last - first + 1
        name = _header_safe(path.rsplit("/", 1)[-1]).replace('"', "_")
        self.send_response(206 if span is not None else 200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Disposition", f"{disposition}; filename*=UTF-8''{quote(name)}; filename=\"{name}\";")
        over = faults.overlong_by(path) if method == "GET" else None
        if over is None:
            self.send_header("Content-Length", str(length))
        else:
            # No length: the body ends where the connection does, wherever the server likes.
            self.send_header("Connection", "close")
            self.close_connection = True
        if span is not None:
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.end_headers()
        if method == "HEAD":
            return
        self.hub.stats.started(path, first)
        cut = faults.truncation(path)
        if cut is not None and cut < length and not self.hub.may_truncate(path, faults.truncate_times):
            cut = None
        reset = self.hub.take_rule(faults, method, path, body=True)
        if reset is not None and reset.reset_at is not None:
            cut = max(0, int(size * reset.reset_at) - first)
        corrupt = faults.corrupts(path)
        rate, drip = faults.slow_bytes_per_s, faults.drip_s(path)
        chunk_size = 1 if drip is not None else _CHUNK if rate is None else max(1, min(_CHUNK, rate // 10))
        sent = 0
        started = time.monotonic()
        try:
            with obj.open("rb") as f:
                if cut is None and not corrupt and rate is None and drip is None and over is None:
                    # No fault on this file: let the kernel copy it (benchmark shards are large).
                    sent = self.connection.sendfile(f, first, length)
                    self._bytes += sent
                    if sent < length:
                        raise OSError(f"object {oid} shrank while being served")
                    return
                f.seek(first)
                while sent < length:
                    want = min(chunk_size, length - sent)
                    if cut is not None:
                        want = min(want, cut - sent)
                        if want <= 0:
                            if reset is not None:
                                self._reset()
                                return
                            # Fewer bytes than Content-Length, then EOF: what a dropped transfer looks like.
                            self.close_connection = True
                            return
                    chunk = f.read(want)
                    if not chunk:
                        raise OSError(f"object {oid} shrank while being served")
                    if corrupt:
                        chunk = self._corrupt(chunk, first + sent, size)
                    if rate is not None and sent and self.hub.faults().down:
                        # Gone down while sending: a server going away leaves its transfers cut short.
                        self.close_connection = True
                        return
                    if rate is not None:
                        # Hold each chunk until the time it is due, so that the last byte arrives at size / rate.
                        ahead = (sent + len(chunk)) / rate - (time.monotonic() - started)
                        if ahead > 0:
                            time.sleep(ahead)
                    if drip is not None:
                        time.sleep(drip)
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    self._bytes += len(chunk)
                while over:
                    more = bytes(min(_CHUNK, over))
                    self.wfile.write(more)
                    over -= len(more)
                    sent += len(more)
                    self._bytes += len(more)
        finally:
            self.hub.stats.count(self.hub.stats.sent, path, sent)

    def _reset(self) -> None:
        """End the connection with a reset (RST), not a close: after the bytes sent have had a moment
        to reach the client, as they would over a link that then drops."""
        self.wfile.flush()
        time.sleep(0.2)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    @staticmethod
    def _corrupt(chunk: bytes, offset: int, size: int) -> bytes:
        half = size // 2
        if offset + len(chunk) <= half:
            return chunk
        keep = max(0, half - offset)
        return chunk[:keep] + chunk[keep:].translate(_INVERT)

    # -- /api/models --

    def _api(self, method: str, rest: list[str], query: dict[str, list[str]], body: bytes) -> None:
        repo_id, tail = _split_api(rest)
        repo = self._repo(repo_id)
        word = tail[0] if tail else ""
        if method in ("GET", "HEAD") and (not tail or (word == "revision" and len(tail) == 2)):
            self._model_info(method, repo, repo.resolve(tail[1] if tail else "main"), query)
        elif method in ("GET", "HEAD") and word == "tree" and len(tail) >= 2:
            self._tree(method, repo, repo.resolve(tail[1]), "/".join(tail[2:]).strip("/"), query)
        elif method == "POST" and word == "paths-info" and len(tail) == 2:
            self._paths_info(method, repo, repo.resolve(tail[1]), body)
        elif method in ("GET", "HEAD") and tail == ["refs"]:
            self._refs(method, repo)
        elif word == "xet-read-token":
            raise HubError(501, None, "Xet is not served here (a stand-in Hub: files come through its HTTP CDN)")
        elif method in ("GET", "HEAD") and word == "commits" and len(tail) == 2:
            self._commits(method, repo, repo.resolve(tail[1]), query)
        else:
            raise HubError(404, None, "Not Found")

    def _model_info(self, method: str, repo: Repo, sha: str, query: dict[str, list[str]]) -> None:
        history = repo.history(sha)
        manifest = history[0]
        files: dict[str, Any] = manifest["files"]
        blobs = query.get("blobs", [""])[0] in _TRUE
        siblings = []
        for path, e in files.items():
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                sibling |= {"size": e["size"], "blobId": e["oid"]}
                if e["lfs"] is not None:
                    lfs = e["lfs"]
                    sibling["lfs"] = {"sha256": lfs["oid"], "size": lfs["size"], "pointerSize": lfs["pointerSize"]}
            siblings.append(sibling)
        info: dict[str, Any] = {
            "_id": repo.repo_id.replace("/", "--"),
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": sha,
            "lastModified": _iso(manifest["time"]),
            "createdAt": _iso(history[-1]["time"]),
            "private": False,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(e["size"] for e in files.values()),
            **manifest.get("model_info", {}),
        }
        config = self._config(files)
        if config is not None:
            info["config"] = config
        if query.get("securityStatus", [""])[0] in _TRUE:
            info["securityRepoStatus"] = {"scansDone": True, "filesWithIssues": []}
        wanted = query.get("expand") or query.get("expand[]")
        if wanted:
            info = {k: v for k, v in info.items() if k in {"_id", "id", *wanted}}
        self._json(method, info)

    def _config(self, files: dict[str, Any]) -> dict[str, Any] | None:
        """The part of config.json the Hub shows in model info (architectures, model type, quantization,
        the auto_map of remote code: ``kimi-deploy lock`` records whether it names a tokenizer)."""
        entry = files.get("config.json")
        if entry is None or entry["size"] > _MAX_BODY:
            return None
        try:
            config = json.loads((self.hub.root / "objects" / entry["sha256"]).read_bytes())
        except (OSError, ValueError):
            return None
        if not isinstance(config, dict):
            return None
        return {k: config[k] for k in ("architectures", "model_type", "quantization_config", "auto_map") if k in config}

    def _entry(self, repo: Repo, sha: str, path: str, expand: bool) -> dict[str, Any]:
        manifest = repo.commit(sha)
        e = manifest["files"].get(path)
        if e is None:
            out: dict[str, Any] = {"type": "directory", "oid": manifest["trees"][path], "size": 0, "path": path}
        else:
            out = {"type": "file", "oid": e["oid"], "size": e["size"], "path": path}
            if e["lfs"] is not None:
                out["lfs"] = e["lfs"]
                out["xetHash"] = _xet_hash(e["sha256"])  # huggingface_hub's RepoFile.xet_hash
        if expand:
            out["lastCommit"] = repo.last_commit(sha, path, is_dir=e is None)
            if e is not None:
                scan = {"virusFound": False, "virusNames": None}
                out["securityFileStatus"] = {"status": "safe", "avScan": scan, "pickleImportScan": None}
        return out

    def _tree(self, method: str, repo: Repo, sha: str, path: str, query: dict[str, list[str]]) -> None:
        files: dict[str, Any] = repo.commit(sha)["files"]
        dirs = _directories(files)
        if path and path not in dirs:
            raise HubError(404, "EntryNotFound", f"Entry not found: {path}", {"X-Repo-Commit": sha})
        recursive = query.get("recursive", [""])[0] in _TRUE
        expand = query.get("expand", [""])[0] in _TRUE
        prefix = f"{path}/" if path else ""
        listing = sorted(
            (
                (p, p in dirs)
                for p in (*files, *dirs)
                if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :])
            ),
            key=lambda item: _git_order(*item),
        )
        try:
            start = max(0, int(query.get("cursor", ["0"])[0]))
        except ValueError:
            raise HubError(400, None, "Bad cursor") from None
        size = self.hub.page_size
        page = [self._entry(repo, sha, p, expand) for p, _ in listing[start : start + size]]
        headers = {}
        if start + size < len(listing):
            where = f"/{quote(path, safe='')}" if path else ""
            params = urlencode(
                {"recursive": str(recursive).lower(), "expand": str(expand).lower(), "cursor": start + size}
            )
            # Later pages name the commit, not the branch: a listing never mixes two commits.
            link = f"{self._origin()}/api/models/{repo.repo_id}/tree/{sha}{where}?{params}"
            headers["Link"] = f'<{link}>; rel="next"'
        self._json(method, page, headers)

    def _paths_info(self, method: str, repo: Repo, sha: str, body: bytes) -> None:
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("application/json"):
            try:
                data = json.loads(body or b"{}")
            except ValueError:
                raise HubError(400, None, "Invalid JSON body") from None
            paths, expand = list(data.get("paths", [])), str(data.get("expand", "")) in _TRUE
        else:
            form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
            paths, expand = form.get("paths", []), form.get("expand", [""])[0] in _TRUE
        files = repo.commit(sha)["files"]
        dirs = _directories(files)
        found = [p.strip("/") for p in paths if isinstance(p, str) and (p.strip("/") in files or p.strip("/") in dirs)]
        self._json(method, [self._entry(repo, sha, p, expand) for p in found])

    def _refs(self, method: str, repo: Repo) -> None:
        refs = repo.refs()

        def items(kind: str, table: dict[str, str]) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": c} for n, c in sorted(table.items())]

        self._json(
            method,
            {
                "branches": items("heads", refs.get("branches", {})),
                "converts": [],
                "tags": items("tags", refs.get("tags", {})),
                "pullRequests": [],
            },
        )

    def _commits(self, method: str, repo: Repo, sha: str, query: dict[str, list[str]]) -> None:
        history = repo.history(sha)
        try:
            page_no = max(0, int(query.get("p", ["0"])[0]))
        except ValueError:
            raise HubError(400, None, "Bad page") from None
        size = self.hub.page_size
        items = [
            {
                "id": m["id"],
                "title": m["title"],
                "message": m["message"],
                "authors": [{"user": m["author"].split(" <")[0], "avatar": None}],
                "date": _iso(m["time"]),
            }
            for m in history[page_no * size : (page_no + 1) * size]
        ]
        headers = {}
        if (page_no + 1) * size < len(history):
            headers["Link"] = f'<{self._origin()}/api/models/{repo.repo_id}/commits/{sha}?p={page_no + 1}>; rel="next"'
        self._json(method, items, headers)


class _Origin(BackgroundServer):
    """A listening address of the fake Hub that drops its open connections when stopped."""

    poll_interval = 0.1  # stop() returns within 0.1 s, as the hub always has (the base allows 0.2)

    def __init__(self, address: tuple[str, int]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.server_address[0])
        # A wildcard bind is reachable on loopback; the wildcard itself is not an address to connect to.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        super().stop()
        # Clients pool keep-alive connections: without this a stopped hub would still answer on them.
        with self._open_lock:
            for conn in self._open:
                with contextlib.suppress(OSError):  # already closed by the client
                    conn.shutdown(socket.SHUT_RDWR)
            self._open.clear()


class _Cdn(_Origin):
    """The Hub's CDN: its LFS files on a port of their own, another origin than the Hub's."""

    def __init__(self, hub: HubServer, address: tuple[str, int]) -> None:
        super().__init__(address)
        self.hub = hub


class HubServer(_Origin):
    """The fake Hub bound to an address, its CDN (``cdn``) on the same address, ``CDN_PORT_OFFSET`` ports up;
    ``start()`` serves both from daemon threads, ``stop()`` ends them and drops open connections.
    ``url`` is the endpoint to give huggingface_hub (``HF_ENDPOINT``/``endpoint=``)."""

    def __init__(
        self,
        root: Path,
        address: tuple[str, int],
        *,
        page_size: int = DEFAULT_PAGE_SIZE,
        log_stream: TextIO | None = sys.stderr,
    ) -> None:
        super().__init__(address)
        self.cdn = _Cdn(self, (address[0], address[1] + CDN_PORT_OFFSET if address[1] else 0))
        self.root = Path(root)
        self.page_size = page_size
        self.stats = Stats()
        self.manifests: dict[str, dict[str, Any]] = {}
        self._faults_text = ""
        self._truncated: Counter[str] = Counter()
        self._failed: Counter[int] = Counter()
        self._faults_lock = threading.Lock()
        self._log_stream = log_stream
        self._log_lock = threading.Lock()

    def start(self) -> Self:
        self.cdn.start()
        return super().start()

    def stop(self) -> None:
        super().stop()
        self.cdn.stop()

    def faults(self) -> Faults:
        """The faults in force now (faults.json is re-read on every request)."""
        text = read_faults_text(self.root)
        with self._faults_lock:
            if text != self._faults_text:
                self._faults_text = text
                self._truncated.clear()  # ``truncate_times`` counts from the last change
                self._failed.clear()  # so do ``"fail"`` rules' ``times``
        return parse_faults(text)

    def may_truncate(self, path: str, times: int | None) -> bool:
        """Whether a body of ``path`` may be cut now; counts the cut when ``times`` limits them."""
        if times is None:
            return True
        with self._faults_lock:
            if self._truncated[path] >= times:
                return False
            self._truncated[path] += 1
            return True

    def take_rule(self, faults: Faults, method: str, path: str, *, body: bool) -> FailRule | None:
        """The first ``"fail"`` rule for this request (a status rule, or with ``body`` a reset rule)
        that has turns left, its turn taken."""
        with self._faults_lock:
            for n, rule in enumerate(faults.fail):
                if rule.matches(method, path) and (rule.reset_at is not None) == body and self._failed[n] < rule.times:
                    self._failed[n] += 1
                    return rule
        return None

    def log(self, line: str) -> None:
        if self._log_stream is not None:
            with self._log_lock:
                print(f"hub: {line}", file=self._log_stream, flush=True)


def serve(
    root: Path,
    bind: str = "127.0.0.1",
    port: int = 0,
    *,
    page_size: int = DEFAULT_PAGE_SIZE,
    log_stream: TextIO | None = sys.stderr,
) -> HubServer:
    """Start a hub for ``root`` on ``bind:port`` (0: any free port) in a thread and return it, serving."""
    return HubServer(Path(root), (bind, port), page_size=page_size, log_stream=log_stream).start()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve ``--root`` until interrupted."""
    parser = argparse.ArgumentParser(description="Fake Hugging Face Hub serving localcluster.hub_repo repos.")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8088)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--page-size", type=int, default=DEFAULT_PAGE_SIZE)
    args = parser.parse_args(argv)
    server = HubServer(args.root, (args.bind, args.port), page_size=args.page_size)
    server.cdn.start()
    server.log(f"serving {args.root} on {server.url}, its CDN on {server.cdn.url}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.cdn.stop()


if __name__ == "__main__":
    main()
