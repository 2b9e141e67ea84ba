"""Fan-out between hosts, run locally on loopback: the peer service and a sync fetching from peers.

Real processes and sockets: ``hostside/weights_peer.py`` serves a revision folder on 127.0.0.x and
``hostside/weights_sync.py`` fetches from it, exactly as two hosts of a run do (each bundled with
the ``hostside`` modules it imports, as the hosts get it). The peer answers only the run's hosts and
key, only files of its lock inside its folder, and bounds what any client can make it spend.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import pack
from kimi_deploy.hostside.boundary_http import MAX_HEAD, MAX_HEADERS, MAX_LINE
from kimi_deploy.hostside.weights_peer import BUSY, HEAD_S, MAX_CONNECTIONS, WAIT_S
from tests.bundled import bundled_program

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

KEY = "k" * 43


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_revision(root: Path, files: dict[str, bytes]) -> dict[str, list[Any]]:
    """Files of a revision, verified: the lock and the verification cache the sync would write."""
    lock, cache = {}, {}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        lock[rel] = [len(data), digest]
        st = path.stat()
        cache[rel] = [st.st_size, st.st_mtime_ns, st.st_ino, digest]
    (root / ".kimi").mkdir(exist_ok=True)
    (root / ".kimi" / "verify-cache.json").write_text(json.dumps(cache))
    return lock


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


def serve(
    root: Path, lock: dict[str, list[Any]], key_file: Path, bind: str, allow: list[str], **more: Any
) -> Iterator[str]:
    port = _free_port()
    request = {
        "dir": str(root),
        "lock": lock,
        "bind": bind,
        "port": port,
        "allow": allow,
        "key_file": str(key_file),
        "idle_exit_s": 30,
        **more,
    }
    program = bundled_program("weights_peer.py", key_file.parent)
    proc = subprocess.Popen([sys.executable, str(program), pack(request)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((bind, port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield f"http://{bind}:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def source(tmp_path: Path, key_file: Path) -> Iterator[tuple[str, Path, dict[str, list[Any]]]]:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.safetensors": os.urandom(300_000), "sub/b.json": b"{}\n"})
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
        yield url, root, lock


def _get(url: str, key: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_the_peer_service_answers_verified_files_to_the_run_key_only(
    source: tuple[str, Path, dict[str, list[Any]]],
) -> None:
    url, root, _ = source
    assert _get(f"{url}/a.safetensors", KEY) == (200, (root / "a.safetensors").read_bytes())
    assert _get(f"{url}/sub/b.json", KEY) == (200, b"{}\n")
    assert _get(f"{url}/a.safetensors", None)[0] == 401
    assert _get(f"{url}/a.safetensors", "x" * 43)[0] == 401
    assert _get(f"{url}/not-in-the-lock", KEY)[0] == 404
    assert _get(f"{url}/../key", KEY)[0] == 404
    # A file changed since it was verified (new mtime) is not served.
    (root / "sub/b.json").write_bytes(b"[]\n")
    assert _get(f"{url}/sub/b.json", KEY)[0] == 404


def test_the_peer_service_closes_connections_from_hosts_outside_the_run_before_reading(
    tmp_path: Path, key_file: Path
) -> None:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.bin": b"weights"})
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.2"]):
        port = int(url.rsplit(":", 1)[1])
        with _connect(port, "127.0.0.1") as s:
            # Nothing sent: closed on the address alone, with no answer.
            assert _answer(s, 5) == b""
        with _connect(port, "127.0.0.2") as s:
            s.sendall(f"GET /a.bin HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
            assert _answer(s, 5).endswith(b"\r\n\r\nweights")


def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def _answer(s: socket.socket, timeout: float) -> bytes:
    """Everything the peer sends until it closes; raises TimeoutError if it holds on past ``timeout``."""
    s.settimeout(timeout)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_the_peer_serves_only_names_of_its_lock_resolved_inside_its_folder(tmp_path: Path, key_file: Path) -> None:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.bin": b"weights", "linked.bin": b"secret"})
    # A file of the lock replaced by a link to a file outside, with the same bytes, recorded in the
    # verification cache as a sync following the link would have: still not served.
    outside = tmp_path / "outside-secret"
    outside.write_bytes(b"secret")
    (root / "linked.bin").unlink()
    (root / "linked.bin").symlink_to(outside)
    cache = json.loads((root / ".kimi/verify-cache.json").read_text())
    st = outside.stat()
    cache["linked.bin"] = [st.st_size, st.st_mtime_ns, st.st_ino, lock["linked.bin"][1]]
    (root / ".kimi/verify-cache.json").write_text(json.dumps(cache))
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
        assert _get(f"{url}/a.bin", KEY) == (200, b"weights")
        assert _get(f"{url}/linked.bin", KEY)[0] == 404
        port = int(url.rsplit(":", 1)[1])
        for target in (
            "/../key",
            "/%2e%2e/key",
            "/%2E%2E%2Fkey",
            "//etc/passwd",
            f"/{key_file}",
            "/.kimi/verify-cache.json",
            "http://127.0.0.1/a.bin",
            "/a.bin?x",
            "/%ff",
        ):
            with _connect(port, "127.0.0.1") as s:
                s.sendall(f"GET {target} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
                answer = _answer(s, 5)
                assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 404 Not Found", b"HTTP/1.1 400 Bad Request"), target


def test_the_peer_refuses_to_start_with_a_lock_naming_a_file_outside_its_folder(tmp_path: Path, key_file: Path) -> None:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.bin": b"weights"})
    lock["../key"] = [44, "sha256:" + "0" * 64]
    request = {
        "dir": str(root),
        "lock": lock,
        "bind": "127.0.0.1",
        "port": _free_port(),
        "allow": ["127.0.0.1"],
        "key_file": str(key_file),
        "idle_exit_s": 30,
    }
    program = bundled_program("weights_peer.py", tmp_path)
    run = subprocess.run(
        [sys.executable, str(program), pack(request)], capture_output=True, text=True, timeout=30, check=False
    )
    assert run.returncode == 6
    assert run.stderr.splitlines() == [
        f"kimi-deploy: weights peer {root}: model file name '../key': must not have an empty, '.' or '..' segment, "
        "found '..'"
    ]


@pytest.fixture
def peer_port(tmp_path: Path, key_file: Path) -> Iterator[int]:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.bin": b"weights"})
    for url in serve(root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
        yield int(url.rsplit(":", 1)[1])


def test_an_idle_connection_is_closed_within_the_wait(peer_port: int) -> None:
    with _connect(peer_port, "127.0.0.1") as s:
        started = time.monotonic()
        assert _answer(s, WAIT_S + 5) == b""
        assert time.monotonic() - started < WAIT_S + 2


def test_a_half_sent_request_is_closed_within_the_head_deadline(peer_port: int) -> None:
    with _connect(peer_port, "127.0.0.1") as s:
        s.sendall(f"GET /a.bin HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n".encode())
        started = time.monotonic()
        answer = _answer(s, HEAD_S + 5)
        assert time.monotonic() - started < HEAD_S + 2
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_head_dripped_byte_by_byte_is_closed_at_the_deadline_too(peer_port: int) -> None:
    with _connect(peer_port, "127.0.0.1") as s:
        started = time.monotonic()
        with pytest.raises((BrokenPipeError, ConnectionResetError)):  # noqa: PT012 - closed mid-drip
            for _ in range(int(HEAD_S * 10) + 40):
                s.sendall(b"X")
                time.sleep(0.1)
        assert time.monotonic() - started < HEAD_S + 3


@pytest.mark.parametrize(
    "head",
    [
        "GET /a.bin HTTP/1.1\r\n" + "".join(f"X-{i}: y\r\n" for i in range(MAX_HEADERS + 1)),
        "GET /a.bin HTTP/1.1\r\nX-Big: " + "y" * MAX_LINE + "\r\n",
        "GET /a.bin HTTP/1.1\r\n"
        + "".join(f"X-{i}: {'y' * (MAX_LINE - 16)}\r\n" for i in range(MAX_HEAD // MAX_LINE + 1)),
    ],
    ids=["too many headers", "too long a header", "too large a head"],
)
def test_a_request_head_over_the_limits_is_refused_even_with_the_key(peer_port: int, head: str) -> None:
    with _connect(peer_port, "127.0.0.1") as s:
        s.sendall(f"{head}Authorization: Bearer {KEY}\r\n\r\n".encode())
        answer = _answer(s, 5)
    assert answer.startswith(b"HTTP/1.1 431 ") or answer == b""  # answered, or reset for the unread rest


def test_connections_beyond_the_cap_are_closed_at_once_and_threads_stay_bounded(tmp_path: Path, key_file: Path) -> None:
    root = tmp_path / "source"
    lock = make_revision(root, {"a.bin": b"weights"})
    port = _free_port()
    request = {
        "dir": str(root),
        "lock": lock,
        "bind": "127.0.0.1",
        "port": port,
        "allow": ["127.0.0.1"],
        "key_file": str(key_file),
        "idle_exit_s": 30,
    }
    program = bundled_program("weights_peer.py", tmp_path)
    proc = subprocess.Popen([sys.executable, str(program), pack(request)], stderr=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 10
        while not held and time.monotonic() < deadline:
            try:
                held.append(_connect(port, "127.0.0.1"))
            except OSError:
                time.sleep(0.05)
        held += [_connect(port, "127.0.0.1") for _ in range(MAX_CONNECTIONS - 1)]
        time.sleep(0.5)
        with _connect(port, "127.0.0.1") as extra:
            # told it is busy and closed at once, not queued behind the others
            assert _answer(extra, 2) == BUSY
            assert BUSY.startswith(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n")
        threads = int(Path(f"/proc/{proc.pid}/status").read_text().split("Threads:")[1].split()[0])
        assert threads <= MAX_CONNECTIONS + 2  # one per connection, the listener, the idle watch
    finally:
        for s in held:
            s.close()
        proc.terminate()
        proc.wait(timeout=10)


def _sync(root: Path, lock: dict[str, list[Any]], peers: list[dict[str, str]], key_file: Path) -> dict[str, Any]:
    request = {
        "repo": "org/model",
        "revision": "a" * 40,
        "dir": str(root),
        "lock": lock,
        "endpoint": None,
        "token_file": None,
        "retries": 2,
        "peers": peers,
        "peer_key_file": str(key_file),
        "progress_log": str(root.parent / "weights.log"),
    }
    program = bundled_program("weights_sync.py", key_file.parent)
    run = subprocess.run(
        [sys.executable, str(program), pack(request)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, Any] = json.loads(run.stdout.splitlines()[-1])
    return result


def test_a_sync_takes_every_file_from_a_peer_and_verifies_it(
    tmp_path: Path, key_file: Path, source: tuple[str, Path, dict[str, list[Any]]]
) -> None:
    url, root, lock = source
    target = tmp_path / "host2" / "revision"
    result = _sync(target, lock, [{"host": "h1", "url": url}], key_file)
    assert result["fetched"] == []  # nothing from the Hub
    assert result["from_peers"] == {"h1": sum(size for size, _ in lock.values())}
    for rel in lock:
        assert (target / rel).read_bytes() == (root / rel).read_bytes()
    cache = json.loads((target / ".kimi/verify-cache.json").read_text())
    assert {rel: entry[3] for rel, entry in cache.items()} == {rel: digest for rel, (_, digest) in lock.items()}
    assert "2 files from peers" in (tmp_path / "host2/weights.log").read_text()
    # Verified while it streamed in: the next run hashes and fetches nothing.
    assert _sync(target, lock, [{"host": "h1", "url": url}], key_file)["from_peers"] == {}


def test_a_sync_waits_its_turn_at_a_busy_peer_rather_than_going_to_the_hub(
    tmp_path: Path, key_file: Path, source: tuple[str, Path, dict[str, list[Any]]]
) -> None:
    """Every slot of the peer taken (other hosts fetching): it answers 503, and the sync, which has
    no Hub to fall back on here, waits until a slot frees and takes every file from that peer."""
    url, _, lock = source
    port = int(url.rsplit(":", 1)[1])
    held = [_connect(port, "127.0.0.1") for _ in range(MAX_CONNECTIONS)]

    def release() -> None:
        for s in held:
            s.close()

    released = threading.Timer(2.0, release)
    released.start()
    try:
        result = _sync(tmp_path / "host2" / "revision", lock, [{"host": "h1", "url": url}], key_file)
    finally:
        released.cancel()
        release()
    assert result["fetched"] == []
    assert result["from_peers"] == {"h1": sum(size for size, _ in lock.values())}


def test_a_peer_serving_a_corrupted_file_is_passed_over_for_the_next(tmp_path: Path, key_file: Path) -> None:
    data = os.urandom(200_000)
    bad_root, good_root = tmp_path / "bad", tmp_path / "good"
    lock = make_revision(bad_root, {"w.bin": data})
    make_revision(good_root, {"w.bin": data})
    # A bit flip on the bad peer with size and mtime kept: it still believes the file verified.
    path = bad_root / "w.bin"
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    for bad_url in serve(bad_root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
        for good_url in serve(good_root, lock, key_file, "127.0.0.1", ["127.0.0.1"]):
            peers = [{"host": "bad", "url": bad_url}, {"host": "good", "url": good_url}]
            result = _sync(tmp_path / "host2" / "revision", lock, peers, key_file)
    assert result["from_peers"] == {"good": len(data)}
    assert (tmp_path / "host2/revision/w.bin").read_bytes() == data
    assert not list((tmp_path / "host2/revision/.kimi/partial").iterdir())


def test_a_local_mirror_folder_is_a_source_too_and_needs_no_key(tmp_path: Path) -> None:
    mirror = tmp_path / "mnt" / "revision"
    lock = make_revision(mirror, {"a.safetensors": os.urandom(50_000), "config.json": b"{}\n"})
    # The Hub's address is dead: a sync that asked it would fail.
    request = {
        "repo": "org/model",
        "revision": "a" * 40,
        "dir": str(tmp_path / "host2" / "revision"),
        "lock": lock,
        "endpoint": "http://127.0.0.1:9/",
        "retries": 0,
        "peers": [{"host": "mirror", "path": str(mirror)}],
    }
    program = bundled_program("weights_sync.py", tmp_path)
    run = subprocess.run(
        [sys.executable, str(program), pack(request)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["from_peers"] == {"mirror": 50_003}
    for rel in lock:
        assert (tmp_path / "host2/revision" / rel).read_bytes() == (mirror / rel).read_bytes()
