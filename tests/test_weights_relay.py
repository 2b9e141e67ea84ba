"""A host relays a file to the next host of its chain while the file still arrives, run locally.

Real processes on loopback: ``hostside/weights_peer.py`` with ``fetching`` (its host's own sync
runs in the same run) serves the partial file of ``hostside/revision_files`` as it grows, holds
back its last byte until the file is placed verified, and ends the answer short when the sync
drops it. The last test chains two real syncs: the second host takes the file from the first
while the first is still receiving it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import pack
from kimi_deploy.hostside import weights_peer
from kimi_deploy.hostside.revision_files import CACHE, meta, partial_path
from tests.bundled import bundled_program
from tests.test_weights_peer import KEY, key_file, make_revision, serve

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

__all__ = ["key_file"]  # the fixture, shared

SIZE = 3 << 20
RELAY_WAIT_S = 10.0


def _until(what: Callable[[], bool], seconds: float = RELAY_WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(0.02)
    return what()


class Reader(threading.Thread):
    """GET one file from a peer, counting what has come so far."""

    def __init__(self, url: str, rel: str) -> None:
        super().__init__(daemon=True)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=30)
        self.rel = rel
        self.body = bytearray()
        self.status = 0
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.connection.request("GET", f"/{self.rel}", headers={"Authorization": f"Bearer {KEY}"})
            answer = self.connection.getresponse()
            self.status = answer.status
            while block := answer.read1(64 << 10):
                self.body += block
        except (OSError, http.client.HTTPException) as exc:
            self.error = exc


def _reading(url: str) -> Reader:
    reader = Reader(url, "w.bin")
    reader.start()
    return reader


@pytest.fixture
def arriving(tmp_path: Path, key_file: Path) -> Iterator[tuple[str, Path, dict[str, list[Any]], bytes]]:
    """A revision folder whose sync is at work (it has touched ``sync-started``, as the sync does)
    and has nothing yet, served with ``fetching``."""
    data = os.urandom(SIZE)
    lock = {"w.bin": [len(data), "sha256:" + hashlib.sha256(data).hexdigest()]}
    root = tmp_path / "revision"
    (root / ".kimi" / "partial").mkdir(parents=True)
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.1"], fetching=True):
        Path(meta(str(root), "sync-started")).touch()
        yield url, root, lock, data


def _place(root: Path, lock: dict[str, list[Any]], rel: str) -> None:
    """What the sync does once a file matches the lock: move it into place, record the verdict."""
    target = root / rel
    os.replace(partial_path(str(root), rel), target)
    st = target.stat()
    (root / ".kimi" / CACHE).write_text(json.dumps({rel: [st.st_size, st.st_mtime_ns, st.st_ino, lock[rel][1]]}))


def test_a_file_is_relayed_as_it_arrives_and_its_last_byte_waits_for_the_verdict(
    arriving: tuple[str, Path, dict[str, list[Any]], bytes],
) -> None:
    url, root, lock, data = arriving
    reader = _reading(url)
    with open(partial_path(str(root), "w.bin"), "wb") as partial:
        partial.write(data[: SIZE // 2])
        partial.flush()
        # Half the file written: the next host has it already, though nothing is verified yet.
        assert _until(lambda: len(reader.body) == SIZE // 2), len(reader.body)
        assert reader.status == 200
        partial.write(data[SIZE // 2 :])
    # All written, not yet verified: all but the last byte.
    assert _until(lambda: len(reader.body) == SIZE - 1)
    time.sleep(0.3)
    assert len(reader.body) == SIZE - 1
    _place(root, lock, "w.bin")
    reader.join(RELAY_WAIT_S)
    assert reader.error is None
    assert bytes(reader.body) == data


def test_a_file_the_sync_drops_ends_the_answer_short(arriving: tuple[str, Path, dict[str, list[Any]], bytes]) -> None:
    url, root, _, data = arriving
    reader = _reading(url)
    path = partial_path(str(root), "w.bin")
    Path(path).write_bytes(data)  # every byte of it, wrong or not: the verdict decides
    assert _until(lambda: len(reader.body) == SIZE - 1)
    os.remove(path)  # what the sync does with a file that does not match the lock
    reader.join(RELAY_WAIT_S)
    # The answer ended short of its Content-Length: the receiver's sync finds the size wrong and
    # goes to its next source.
    assert not reader.is_alive()
    assert len(reader.body) == SIZE - 1


def test_a_file_still_to_come_is_waited_for(
    arriving: tuple[str, Path, dict[str, list[Any]], bytes],
) -> None:
    url, root, lock, data = arriving
    reader = _reading(url)
    time.sleep(0.5)
    assert reader.status == 0  # held: nothing answered yet
    Path(partial_path(str(root), "w.bin")).write_bytes(data)
    _place(root, lock, "w.bin")
    reader.join(RELAY_WAIT_S)
    assert (reader.status, bytes(reader.body)) == (200, data)


def test_a_sync_stamped_by_the_coarse_clock_just_after_the_start_counts_as_begun(
    tmp_path: Path, key_file: Path
) -> None:
    """File times lag time.time_ns() by up to a clock tick: a sync that began and ended right after
    the service started may carry times a few ms before its start, and must still count as this
    run's (ended: nothing more to come), not leave the peer waiting out PENDING_S."""
    root = tmp_path / "revision"
    (root / ".kimi").mkdir(parents=True)
    peer = weights_peer.Peer({"dir": str(root), "lock": {}, "key_file": str(key_file), "fetching": True})
    for name, lag in (("sync-started", 4_000_000), ("synced", 3_000_000)):  # 4 and 3 ms "before"
        Path(meta(str(root), name)).touch()
        os.utime(meta(str(root), name), ns=(peer.started_ns - lag, peer.started_ns - lag))
    assert not peer.arriving()


def test_once_its_sync_has_ended_a_peer_refuses_what_it_does_not_hold(tmp_path: Path, key_file: Path) -> None:
    lock = {"w.bin": [3, "sha256:" + hashlib.sha256(b"abc").hexdigest()]}
    root = tmp_path / "revision"
    (root / ".kimi").mkdir(parents=True)
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.1"], fetching=True):
        Path(meta(str(root), "sync-started")).touch()
        Path(meta(str(root), "synced")).touch()  # the sync ended (failed) without the file
        reader = Reader(url, "w.bin")  # run here, not as a thread
        started = time.monotonic()
        reader.run()
        assert reader.status == 404
        assert time.monotonic() - started < 5


def _grown(path: Path, size: int) -> Callable[[], bool]:
    return lambda: path.exists() and path.stat().st_size >= size


@contextlib.contextmanager
def _ending(*procs: subprocess.Popen[str]) -> Iterator[None]:
    """Whatever the test found, none of ``procs`` outlives it."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def _sync_proc(
    root: Path, lock: dict[str, list[Any]], peers: list[dict[str, str]], key: Path, **more: Any
) -> subprocess.Popen[str]:
    """The bundled sync of ``root``, as a host runs it, with the test's own Python (which has
    huggingface_hub, as the hosts' tools venv does); ``more`` adds to its request or overrides it."""
    request = {
        "repo": "org/model",
        "revision": "a" * 40,
        "dir": str(root),
        "lock": lock,
        "endpoint": None,
        "token_file": None,
        "retries": 0,
        "peers": peers,
        "peer_key_file": str(key),
        **more,
    }
    program = bundled_program("weights_sync.py", key.parent)
    command = [sys.executable, str(program), pack(request)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_next_host_of_a_chain_receives_a_file_while_the_host_before_it_still_does(
    tmp_path: Path, key_file: Path
) -> None:
    """Host B syncs from a slow source (a named pipe in a mirror folder, written a piece at a time)
    and serves with ``fetching``; host C syncs from B. C holds bytes of the file before B's source
    has given the whole of it, and both end with the file, verified."""
    data = os.urandom(SIZE)
    lock = {"w.bin": [len(data), "sha256:" + hashlib.sha256(data).hexdigest()]}
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    os.mkfifo(mirror / "w.bin")
    b_root, c_root = tmp_path / "b" / "revision", tmp_path / "c" / "revision"
    b_root.mkdir(parents=True)
    for url in serve(b_root, lock, key_file, "127.0.0.1", ["127.0.0.1"], fetching=True):
        b = _sync_proc(b_root, lock, [{"host": "mirror", "path": str(mirror)}], key_file)
        c = _sync_proc(c_root, lock, [{"host": "b", "url": url}], key_file)
        c_partial = Path(partial_path(str(c_root), "w.bin"))
        with _ending(b, c):
            with open(mirror / "w.bin", "wb") as pipe:
                for piece in range(4):
                    pipe.write(data[piece * SIZE // 4 : (piece + 1) * SIZE // 4])
                    pipe.flush()
                    if piece == 1:
                        assert _until(_grown(c_partial, SIZE // 4))
                        assert b.poll() is None  # B is still receiving
            _, b_err = b.communicate(timeout=30)
            c_out, c_err = c.communicate(timeout=30)
    assert b.returncode == 0, b_err
    assert c.returncode == 0, c_err
    assert json.loads(c_out.splitlines()[-1])["from_peers"] == {"b": SIZE}
    assert (c_root / "w.bin").read_bytes() == data


def test_a_host_whose_source_fails_mid_file_takes_it_from_the_host_before(
    tmp_path: Path, key_file: Path, arriving: tuple[str, Path, dict[str, list[Any]], bytes]
) -> None:
    """C fetches from B, which relays a file it is receiving; B's sync drops the file halfway
    (its own source failed). C's answer ends short, and C takes the file from A, the host before B
    in the chain: not from the Hub (this sync has none)."""
    b_url, b_root, lock, data = arriving
    a_root = tmp_path / "a" / "revision"
    assert make_revision(a_root, {"w.bin": data}) == lock
    for a_url in serve(a_root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
        partial = Path(partial_path(str(b_root), "w.bin"))
        with open(partial, "wb") as f:
            f.write(data[: SIZE // 2])
            f.flush()
            c_root = tmp_path / "c" / "revision"
            c = _sync_proc(c_root, lock, [{"host": "b", "url": b_url}, {"host": "a", "url": a_url}], key_file)
            c_partial = Path(partial_path(str(c_root), "w.bin"))
            assert _until(_grown(c_partial, SIZE // 2))
            partial.unlink()  # B's sync gives the file up
        c_out, c_err = c.communicate(timeout=30)
    assert c.returncode == 0, c_err
    result = json.loads(c_out.splitlines()[-1])
    assert result["from_peers"] == {"a": SIZE}
    assert result["fetched"] == []
    assert (c_root / "w.bin").read_bytes() == data


def test_a_partial_file_a_killed_run_left_is_removed_by_the_next_sync(tmp_path: Path, key_file: Path) -> None:
    """A peer would relay it to nobody's benefit: it is no file this sync writes."""
    root = tmp_path / "revision"
    lock = make_revision(root, {"w.bin": b"whole"})
    stale = Path(partial_path(str(root), "w.bin"))
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    sync = _sync_proc(root, lock, [], key_file)
    out, err = sync.communicate(timeout=30)
    assert sync.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["removed"] == [f".kimi/partial/{stale.name}"]
    assert not stale.exists()
