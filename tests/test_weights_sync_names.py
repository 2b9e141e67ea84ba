"""The host-side sync given a lock whose names, or whose revision folder, lead outside the folder.

``hostside/weights_sync.py`` runs as root: before it removes or writes anything it checks every
name of its lock and resolves every path inside the revision folder, so a crafted lock (or a
symlink in the folder) can neither delete nor overwrite a file elsewhere. Runs the bundled program
as a host does, with a source serving the attacker's bytes for any name it is asked for.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import pack
from localcluster.hub import serve
from tests.bundled import bundled_program

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

EVIL = b"* * * * * root /bin/sh -c 'id > /tmp/owned'\n"
PRECIOUS = b"root:x:0:0:root:/root:/bin/bash\n"
DEAD_HUB = "http://127.0.0.1:9/"  # nothing listens: a sync that asks the Hub fails there


@pytest.fixture
def evil_source() -> Iterator[str]:
    """An HTTP source answering ``EVIL`` for every path, whatever the key."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(EVIL)))
            self.end_headers()
            self.wfile.write(EVIL)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_sync(
    tmp_path: Path, root: Path, lock: dict[str, list[Any]], peers: list[dict[str, str]], endpoint: str = DEAD_HUB
) -> subprocess.CompletedProcess[str]:
    key = tmp_path / "peer-key"
    key.write_text("k" * 43 + "\n")
    request = {
        "repo": "org/model",
        "revision": "a" * 40,
        "dir": str(root),
        "lock": lock,
        "endpoint": endpoint,
        "token_file": None,
        "retries": 0,
        "peers": peers,
        "peer_key_file": str(key),
    }
    program = bundled_program("weights_sync.py", tmp_path)
    return subprocess.run(
        [sys.executable, str(program), pack(request)], capture_output=True, text=True, timeout=120, check=False
    )


def _evil_entry() -> list[Any]:
    return [len(EVIL), "sha256:" + hashlib.sha256(EVIL).hexdigest()]


@pytest.mark.parametrize("kind", ["traversal", "absolute"])
@pytest.mark.parametrize("source", ["peer", "hub"])
def test_a_lock_naming_a_file_outside_the_revision_deletes_and_writes_nothing(
    tmp_path: Path, evil_source: str, kind: str, source: str
) -> None:
    victim = tmp_path / "etc" / "passwd"
    victim.parent.mkdir()
    victim.write_bytes(PRECIOUS)
    root = tmp_path / "srv" / "models" / "org--model" / ("a" * 40)
    name = "../../../../etc/passwd" if kind == "traversal" else str(victim)
    assert (root / name).resolve() == victim  # where the name leads when joined to the revision folder
    # With a peer, the attacker's bytes match the lock and would be moved over the victim; with the
    # Hub alone, the victim (not matching the lock) would be removed before asking the Hub.
    peers = [{"host": "h1", "url": evil_source}] if source == "peer" else []
    run = run_sync(tmp_path, root, {name: _evil_entry(), "config.json": _evil_entry()}, peers)
    assert victim.read_bytes() == PRECIOUS
    assert run.returncode == 6, run.stderr
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"kimi-deploy: weights org/model@aaaaaaaaaaaa: {root}: model file name {name!r}: must ")
    assert not root.exists()  # refused before anything was created, linked or removed
    assert json.loads(run.stdout)["error"] == "name"


@pytest.mark.parametrize("source", ["peer", "hub"])
def test_a_symlink_in_the_revision_pointing_outside_is_not_followed_to_write_or_delete(
    tmp_path: Path, evil_source: str, source: str
) -> None:
    outside = tmp_path / "etc" / "cron.d"
    outside.mkdir(parents=True)
    victim = outside / "x"
    victim.write_bytes(PRECIOUS)
    root = tmp_path / "revision"
    root.mkdir()
    (root / "shards").symlink_to(outside)
    peers = [{"host": "h1", "url": evil_source}] if source == "peer" else []
    run = run_sync(tmp_path, root, {"shards/x": _evil_entry()}, peers)
    assert victim.read_bytes() == PRECIOUS
    assert sorted(p.name for p in outside.iterdir()) == ["x"]
    assert run.returncode == 6, run.stderr
    (line,) = run.stderr.splitlines()
    assert f"model file name 'shards/x': resolves to '{victim}', outside '{root}'" in line


def test_a_mirror_folder_is_read_only_inside_itself(tmp_path: Path) -> None:
    # The mirror (a network mount) holds a symlink to a root-only file: the sync must not copy it
    # into the world-readable revision, even when its bytes match the lock.
    secret = tmp_path / "shadow"
    secret.write_bytes(PRECIOUS)
    mirror = tmp_path / "mnt" / "revision"
    mirror.mkdir(parents=True)
    (mirror / "w.bin").symlink_to(secret)
    root = tmp_path / "revision"
    lock = {"w.bin": [len(PRECIOUS), "sha256:" + hashlib.sha256(PRECIOUS).hexdigest()]}
    # A Hub without the repository answers at once (a dead one is retried for seconds).
    (tmp_path / "hub").mkdir()
    hub = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        run = run_sync(tmp_path, root, lock, [{"host": "mirror", "path": str(mirror)}], endpoint=hub.url)
    finally:
        hub.stop()
    assert not (root / "w.bin").exists()
    assert run.returncode != 0  # no source could give it: the Hub was asked, and has no such repository
    (line,) = run.stderr.splitlines()
    assert line.startswith("kimi-deploy: ")
