"""A PEP 503 "simple" package index over a directory of wheels, stdlib only, for hosts without internet.

    python -m localcluster.pkgindex --bind ADDR --port PORT --root DIR

serves ``DIR/files/*.whl``: ``/simple/`` lists the projects, ``/simple/<normalized name>/`` their files
with ``#sha256=`` fragments and ``data-requires-python``, ``/files/<name>`` the bytes. Hosts install
with ``pip install --index-url http://ADDR:PORT/simple --trusted-host ADDR vllm==0.34.0``.

For tests: ``GET /_stats`` counts requests and bytes per file (``DELETE /_stats`` resets them), and
``DIR/faults.json``, read again on every request, injects failures: ``{"down": true}`` answers 503 to
everything but ``/_stats``; ``{"missing": ["vllm==0.34.0", "sglang"]}`` hides releases (or projects)
from listings and downloads; ``{"corrupt": ["vllm==0.34.1"]}`` serves other bytes than the listed hash.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import threading
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from localcluster.background_server import (
    BackgroundHandler,
    BackgroundServer,
    parse_command_line,
    run_until_signalled,
)

FAULTS_FILE = "faults.json"
_WHEEL_NAME = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl")


def normalize(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Dist:
    filename: str
    project: str  # normalized
    version: str
    sha256: str
    requires_python: str | None


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter[str] = field(default_factory=Counter)
    file_requests: Counter[str] = field(default_factory=Counter)
    file_bytes: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests_total": sum(self.requests.values()),
                "paths": dict(sorted(self.requests.items())),
                "files": {
                    name: {"requests": self.file_requests[name], "bytes": self.file_bytes[name]}
                    for name in sorted(self.file_requests)
                },
            }

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.file_requests.clear()
            self.file_bytes.clear()


@dataclass(frozen=True)
class Faults:
    down: bool = False
    missing: frozenset[str] = frozenset()
    corrupt: frozenset[str] = frozenset()

    @staticmethod
    def _matches(specs: frozenset[str], dist: Dist) -> bool:
        return normalize(dist.project) in specs or f"{dist.project}=={dist.version}" in specs

    def hides(self, dist: Dist) -> bool:
        return self._matches(self.missing, dist)

    def corrupts(self, dist: Dist) -> bool:
        return self._matches(self.corrupt, dist)


def _specs(values: Any) -> frozenset[str]:
    out = set()
    for value in values or []:
        name, eq, version = str(value).partition("==")
        out.add(f"{normalize(name.strip())}=={version.strip()}" if eq else normalize(name.strip()))
    return frozenset(out)


class Index:
    """The wheels under ``root/files``; a file's hash and metadata are read once per (size, mtime)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = root / "files"
        self._cache: dict[str, tuple[tuple[int, int], Dist]] = {}
        self._lock = threading.Lock()

    def faults(self) -> Faults:
        path = self.root / FAULTS_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Faults()
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} is not readable JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object")
        return Faults(bool(data.get("down")), _specs(data.get("missing")), _specs(data.get("corrupt")))

    def _dist(self, path: Path) -> Dist | None:
        match = _WHEEL_NAME.fullmatch(path.name)
        if match is None:
            return None
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = path.read_bytes()
        requires = None
        try:
            with zipfile.ZipFile(path) as wheel:
                meta = next((n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")), None)
                if meta is not None:
                    requires = HeaderParser().parsestr(wheel.read(meta).decode("utf-8")).get("Requires-Python")
        except zipfile.BadZipFile:
            pass
        dist = Dist(path.name, normalize(match["name"]), match["version"], hashlib.sha256(data).hexdigest(), requires)
        with self._lock:
            self._cache[path.name] = (key, dist)
        return dist

    def dists(self, faults: Faults) -> list[Dist]:
        found = (self._dist(p) for p in sorted(self.files.glob("*.whl")) if p.is_file())
        return [d for d in found if d is not None and not faults.hides(d)]


def _page(title: str, links: list[str]) -> bytes:
    body = "\n".join(f"    {link}<br/>" for link in links)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    ).encode()


class IndexServer(BackgroundServer):
    """The index over ``root`` bound to ``bind:port``; ``start()``/``stop()`` as ``BackgroundServer``."""

    def __init__(self, root: Path, bind: str, port: int) -> None:
        self.index = Index(root)
        self.stats = Stats()
        super().__init__((bind, port), _Handler)

    @property
    def url(self) -> str:
        """The index URL to give pip (``--index-url``)."""
        return f"{super().url}/simple"


class _Handler(BackgroundHandler):
    server: IndexServer

    def _send(self, status: int, body: bytes, content_type: str = "text/html; charset=utf-8", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def do_DELETE(self) -> None:
        if urlsplit(self.path).path == "/_stats":
            self.server.stats.reset()
            self._send(200, b"{}", "application/json")
        else:
            self._text(405, "method not allowed\n")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = unquote(urlsplit(self.path).path)
        if path == "/_stats":
            self._send(200, json.dumps(self.server.stats.snapshot()).encode(), "application/json")
            return
        with self.server.stats.lock:
            self.server.stats.requests[path] += 1
        try:
            faults = self.server.index.faults()
        except ValueError as exc:
            self._text(500, f"{exc}\n")
            return
        if faults.down:
            self._text(503, "index is down (faults.json)\n")
            return
        if path in ("/simple", "/simple/"):
            projects = sorted({d.project for d in self.server.index.dists(faults)})
            self._send(200, _page("Simple index", [f'<a href="/simple/{p}/">{p}</a>' for p in projects]))
        elif path.startswith("/simple/"):
            self._project(path.removeprefix("/simple/").strip("/"), faults)
        elif path.startswith("/files/"):
            self._file(path.removeprefix("/files/"), faults)
        else:
            self._text(404, "not found\n")

    def _project(self, name: str, faults: Faults) -> None:
        if name != normalize(name):
            # PEP 503: other spellings redirect to the normalized URL.
            self._send(301, b"", Location=f"/simple/{normalize(name)}/")
            return
        dists = [d for d in self.server.index.dists(faults) if d.project == name]
        if not dists:
            self._text(404, f"no project {name}\n")
            return
        links = []
        for d in dists:
            requires = f' data-requires-python="{html.escape(d.requires_python)}"' if d.requires_python else ""
            links.append(f'<a href="/files/{d.filename}#sha256={d.sha256}"{requires}>{d.filename}</a>')
        self._send(200, _page(f"Links for {name}", links))

    def _file(self, filename: str, faults: Faults) -> None:
        dist = next((d for d in self.server.index.dists(faults) if d.filename == filename), None)
        if dist is None or "/" in filename:
            self._text(404, f"no file {filename}\n")
            return
        data = (self.server.index.files / filename).read_bytes()
        if faults.corrupts(dist):
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
        if self.command == "GET":
            with self.server.stats.lock:
                self.server.stats.file_requests[filename] += 1
                self.server.stats.file_bytes[filename] += len(data)
        self._send(200, data, "application/octet-stream")


def serve(root: Path, bind: str = "127.0.0.1", port: int = 0) -> IndexServer:
    """An index over ``root`` listening on ``bind:port`` (0: any free port), already serving; ``.stop()`` ends it."""
    return IndexServer(root, bind, port).start()


def main(argv: list[str] | None = None) -> None:
    args = parse_command_line(
        "localcluster.pkgindex", __doc__.split("\n")[0], 8766, "directory holding files/*.whl", argv
    )
    (args.root / "files").mkdir(parents=True, exist_ok=True)
    server = IndexServer(args.root, args.bind, args.port)
    server.verbose = args.verbose
    run_until_signalled(server, str(args.root / "files"))


if __name__ == "__main__":
    main()
