"""The chain's source relays what it fetches from the Hub while it arrives, run locally.

Real processes on loopback: the fake Hub (``localcluster.hub``, a repository written here in its
layout, an LFS file behind its ``/resolve`` redirect), talked to by the real huggingface_hub
client inside ``hostside/weights_sync.py`` with ``in_order`` (the host others fetch from while it
fetches); its ``hostside/weights_peer.py`` with ``fetching``; and the next host's sync, fetching
from that peer. The next host holds bytes of a file before the source has it whole, each file
leaves the Hub once, and a file the Hub serves wrong is fetched again, then named, never verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.revision_files import load_cache, partial_path
from localcluster.hub import HubServer, serve, write_faults
from localcluster.tiny_model import git_blob_sha1
from tests.test_weights_peer import key_file
from tests.test_weights_peer import serve as serve_peer
from tests.test_weights_relay import _ending, _grown, _sync_proc, _until

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

__all__ = ["key_file"]  # the fixture, shared

REPO = "org/model"
COMMIT = hashlib.sha1(b"a revision relayed from the Hub", usedforsecurity=False).hexdigest()
WEIGHTS = os.urandom(1 << 20)
CONFIG = b'{"model_type": "llama"}\n'
# About 3 s for the LFS file: time enough to see it relayed before it is whole.
BYTES_PER_S = 350_000


def _write_repo(root: Path, files: dict[str, tuple[bytes, bool]] | None = None) -> dict[str, list[Any]]:
    """``REPO`` at ``COMMIT`` in the fake Hub's layout, its lock: ``files`` (name: bytes, whether
    LFS), by default an LFS file and a small one."""
    files = files or {"w.safetensors": (WEIGHTS, True), "config.json": (CONFIG, False)}
    (root / "objects").mkdir(parents=True)
    entries, lock = {}, {}
    for name, (data, lfs) in files.items():
        sha256 = hashlib.sha256(data).hexdigest()
        (root / "objects" / sha256).write_bytes(data)
        oid = git_blob_sha1(data)
        entries[name] = {
            "size": len(data),
            "sha256": sha256,
            "oid": oid,
            "lfs": {"oid": sha256, "size": len(data), "pointerSize": 130} if lfs else None,
        }
        lock[name] = [len(data), f"sha256:{sha256}" if lfs else f"gitblob:{oid}"]
    manifest = {
        "format": 1,
        "id": COMMIT,
        "parents": [],
        "author": "a <a@example.invalid>",
        "time": 1767225600,
        "title": "weights",
        "message": "",
        "trees": {},
        "files": entries,
    }
    repo = root / "repos" / REPO
    (repo / "commits").mkdir(parents=True)
    (repo / "commits" / f"{COMMIT}.json").write_text(json.dumps(manifest))
    (repo / "refs.json").write_text(json.dumps({"branches": {"main": COMMIT}, "tags": {}}))
    return lock


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, list[Any]]]]:
    lock = _write_repo(tmp_path / "hub")
    write_faults(tmp_path / "hub", {"slow_bytes_per_s": BYTES_PER_S})
    server = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        yield server, lock
    finally:
        server.stop()


def _sync(root: Path, lock: dict[str, list[Any]], key: Path, **more: Any) -> subprocess.Popen[str]:
    return _sync_proc(root, lock, more.pop("peers", []), key, repo=REPO, revision=COMMIT, retries=1, **more)


@contextlib.contextmanager
def _chain(
    tmp_path: Path, key: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str]]]:
    """Host A syncing from the Hub with ``in_order`` and serving with ``fetching``, host C syncing
    from A: their running syncs (under ``tmp_path/a`` and ``tmp_path/c``), ended with the block."""
    server, lock = hub
    a_root = tmp_path / "a" / "revision"
    a_root.mkdir(parents=True)
    for url in serve_peer(a_root, lock, key, "127.0.0.1", ["127.0.0.1"], fetching=True):
        a = _sync(a_root, lock, key, endpoint=server.url, in_order=True)
        c = _sync(tmp_path / "c" / "revision", lock, key, peers=[{"host": "a", "url": url}])
        with _ending(a, c):
            yield a, c


def test_the_next_host_receives_a_file_while_the_source_still_fetches_it_from_the_hub(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = hub
    a_root, c_root = tmp_path / "a" / "revision", tmp_path / "c" / "revision"
    with _chain(tmp_path, key_file, hub) as (a, c):
        c_partial = Path(partial_path(str(c_root), "w.safetensors"))
        assert _until(_grown(c_partial, len(WEIGHTS) // 4))
        # A quarter of it is on the next host, and the source has not the whole of it yet.
        assert not (a_root / "w.safetensors").exists()
        assert a.poll() is None
        a_out, a_err = a.communicate(timeout=60)
        c_out, c_err = c.communicate(timeout=60)
    assert a.returncode == 0, a_err
    assert c.returncode == 0, c_err
    assert sorted(json.loads(a_out.splitlines()[-1])["fetched"]) == sorted(lock)
    assert json.loads(c_out.splitlines()[-1])["from_peers"] == {"a": len(WEIGHTS) + len(CONFIG)}
    assert (c_root / "w.safetensors").read_bytes() == WEIGHTS
    assert (c_root / "config.json").read_bytes() == CONFIG
    # Each file left the Hub once (one body each), for both hosts.
    assert server.stats.snapshot()["downloads"] == {"w.safetensors": 1, "config.json": 1}


def test_a_file_the_hub_serves_wrong_is_fetched_again_then_named_and_never_verified(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = hub
    write_faults(tmp_path / "hub", {"corrupt": ["w.safetensors"]})
    root = tmp_path / "a" / "revision"
    sync = _sync(root, lock, key_file, endpoint=server.url, in_order=True)
    out, err = sync.communicate(timeout=60)
    assert sync.returncode == 4, err
    assert err.splitlines()[-1].startswith("kimi-deploy: w.safetensors does not match the lock after retries: ")
    assert json.loads(out)["file"] == "w.safetensors"
    # Nothing relayable is left of it, and nothing a peer would serve: it is not recorded verified.
    assert not Path(partial_path(str(root), "w.safetensors")).exists()
    assert load_cache(str(root))["w.safetensors"][3] != lock["w.safetensors"][1]
    assert (root / "config.json").read_bytes() == CONFIG
    # the streamed try, then the one retry the request allows
    assert server.stats.snapshot()["downloads"]["w.safetensors"] == 2


def test_a_body_the_hub_drops_resumes_where_it_stopped_and_reaches_the_next_host_whole(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server = hub[0]
    write_faults(tmp_path / "hub", {"truncate": {"w.safetensors": 300_000}, "truncate_times": 1})
    c_root = tmp_path / "c" / "revision"
    with _chain(tmp_path, key_file, hub) as (a, c):
        _, a_err = a.communicate(timeout=60)
        c_out, c_err = c.communicate(timeout=60)
    assert a.returncode == 0, a_err
    assert c.returncode == 0, c_err
    assert json.loads(c_out.splitlines()[-1])["from_peers"] == {"a": len(WEIGHTS) + len(CONFIG)}
    assert (c_root / "w.safetensors").read_bytes() == WEIGHTS
    stats = server.stats.snapshot()
    # Two bodies: the one dropped at 300,000 bytes and the rest of it (Range), not the whole again.
    assert stats["downloads"]["w.safetensors"] == 2
    assert stats["bytes"]["w.safetensors"] == len(WEIGHTS)


def test_a_source_answering_the_rest_with_the_whole_body_starts_the_file_over(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """A body cut short is resumed with Range; a source that answers it with the whole body (200)
    starts the file and its hash over, and the file is placed verified."""
    server, lock = hub
    write_faults(
        tmp_path / "hub", {"truncate": {"w.safetensors": 300_000}, "truncate_times": 1, "whole": ["w.safetensors"]}
    )
    root = tmp_path / "revision"
    proc = _sync(root, lock, key_file, endpoint=server.url, hub_backoff_s=0.05)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["fetched"] == ["config.json", "w.safetensors"]
    assert (root / "w.safetensors").read_bytes() == WEIGHTS
    stats = server.stats.snapshot()
    assert stats["starts"]["w.safetensors"] == [0, 0]  # asked for the rest, was sent the whole
    assert stats["bytes"]["w.safetensors"] == 300_000 + len(WEIGHTS)
