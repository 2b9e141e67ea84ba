"""A hostile Hub, CDN or mirror, run locally: bytes and time stay bounded.

The fake Hub (``localcluster.hub``) on loopback streams a file's body past its size, drips it a
byte at a time, or answers every GET 429 with a long ``Retry-After``; a mirror folder holds a file
larger than the lock says, or drips it through a named pipe. ``hostside/weights_sync.py`` (bundled,
with the real huggingface_hub client) syncs against them with small deadlines and budgets. Each
file ends within its deadline in one line naming it and why, nothing past the locked size is ever
written to its partial file, and the sync ends within its budget instead of riding the source out.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.revision_files import partial_path
from localcluster.hub import HubServer, serve, write_faults
from tests.test_weights_hub_relay import COMMIT, REPO, _write_repo
from tests.test_weights_hub_weather import SHARDS
from tests.test_weights_peer import key_file
from tests.test_weights_relay import _sync_proc

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

__all__ = ["key_file"]  # the fixture, shared

SIZE = 4096
WEIGHTS = os.urandom(SIZE)
CONFIG = b'{"model_type": "llama"}\n'
NAME = "w.safetensors"
# The most a case may take before it counts as hanging: the code before these bounds took
# minutes to hours for each.
BOUND_S = 40.0


def _serve_repo(root: Path, files: dict[str, tuple[bytes, bool]]) -> tuple[HubServer, dict[str, list[Any]]]:
    lock = _write_repo(root, files)
    return serve(root, "127.0.0.1", 0, log_stream=None), lock


@pytest.fixture
def small_hub(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, list[Any]]]]:
    """A 4 KiB LFS file and a small one."""
    server, lock = _serve_repo(tmp_path / "hub", {NAME: (WEIGHTS, True), "config.json": (CONFIG, False)})
    try:
        yield server, lock
    finally:
        server.stop()


@pytest.fixture
def shard_hub(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, list[Any]]]]:
    """96 shards of 96 KiB and a small file."""
    files = {name: (data, True) for name, data in SHARDS.items()} | {"config.json": (CONFIG, False)}
    server, lock = _serve_repo(tmp_path / "hub", files)
    try:
        yield server, lock
    finally:
        server.stop()


class _Largest:
    """The largest size a file reaches while watched (checked every half millisecond)."""

    def __init__(self, path: str) -> None:
        self.path, self.seen = path, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.stop.wait(0.0005):
            self._look()

    def _look(self) -> None:
        with contextlib.suppress(OSError):
            self.seen = max(self.seen, os.stat(self.path).st_size)

    def __enter__(self) -> _Largest:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self._look()


def _sync(
    tmp_path: Path, key: Path, lock: dict[str, list[Any]], watch: str | None = None, **more: Any
) -> tuple[int, Any, str, float, int]:
    """The sync of ``tmp_path/revision``, killed past ``BOUND_S``; its exit status, JSON, stderr,
    seconds, and the largest size ``watch``'s partial file reached."""
    root = tmp_path / "revision"
    request = {
        "repo": REPO,
        "revision": COMMIT,
        "retries": 1,
        "progress_log": str(tmp_path / "progress.log"),
        "hub_backoff_s": 0.05,
        **more,
    }
    started = time.monotonic()
    with _Largest(partial_path(str(root), watch or NAME)) as largest:
        proc = _sync_proc(root, lock, request.pop("peers", []), key, **request)
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"the sync still ran after {BOUND_S:.0f} s")
    seconds = time.monotonic() - started
    lines = out.splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else None, err, seconds, largest.seen


def _line(err: str) -> str:
    (line,) = [x for x in err.splitlines() if x.startswith("kimi-deploy: ")]
    return line


def _retries(tmp_path: Path, rel: str) -> list[str]:
    log = tmp_path / "progress.log"
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    return re.findall(rf": {re.escape(rel)}: (.*; retry \d+ of \d+ in [0-9.]+ s, from byte \d+ of \d+)$", text, re.M)


def test_a_source_that_streams_past_the_size_gets_nothing_past_it_written(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """The CDN sends the file and 64 MiB more, with no length: each try stops at the locked size,
    and the file ends out of tries in one line saying so."""
    server, lock = small_hub
    write_faults(tmp_path / "hub", {"overlong": {NAME: 64 << 20}})
    code, result, err, seconds, largest = _sync(tmp_path, key_file, lock, endpoint=server.url, hub_attempts=1)
    assert code == 5, err
    assert _line(err) == (
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {server.url}: 1 of 2 files out of tries, "
        f"first {NAME} after 2: the source sent more than the locked {SIZE} bytes (the rest are in "
        "place; a run again resumes)"
    )
    assert result["fetched"] == ["config.json"]
    assert largest <= SIZE
    assert not (tmp_path / "revision" / NAME).exists()
    (retry,) = _retries(tmp_path, NAME)
    assert retry.startswith(f"the source sent more than the locked {SIZE} bytes; retry 1 of 1 in ")
    print(f"streams past the size: ended in {seconds:.1f} s, the partial file at most {largest} bytes")


def test_a_source_that_drips_ends_at_the_file_s_deadline(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """A byte every 0.2 s never trips a read timeout; the file's deadline (its floor here: 4 KiB at
    the least rate takes less) ends it, and what came stays for the next run."""
    server, lock = small_hub
    write_faults(tmp_path / "hub", {"drip": {NAME: 0.2}})
    code, result, err, seconds, largest = _sync(
        tmp_path, key_file, lock, endpoint=server.url, file_floor_s=1.5, min_bytes_per_s=1 << 20
    )
    assert code == 5, err
    line = _line(err)
    match = re.fullmatch(
        rf"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {re.escape(server.url)}: 1 of 2 files out of tries, first "
        rf"{NAME} after 1: the file's deadline of 1.5 s passed at byte (\d+) of {SIZE} \(the longer of 1.5 s and "
        rf"its size at 1048576 bytes/s\) \(the rest are in place; a run again resumes\)",
        line,
    )
    assert match, line
    held = os.stat(partial_path(str(tmp_path / "revision"), NAME)).st_size
    assert 0 < held == int(match.group(1)) <= largest <= SIZE
    assert result["fetched"] == ["config.json"]
    assert seconds < 15, seconds
    print(f"drip: ended in {seconds:.1f} s at byte {held} of {SIZE}")


def test_the_hub_s_part_of_a_sync_ends_at_its_deadline(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """Every file dripping, each file's own deadline a minute: the sync's deadline ends them all."""
    server, lock = small_hub
    write_faults(tmp_path / "hub", {"drip": {"*": 0.2}})
    code, result, err, seconds, _ = _sync(
        tmp_path, key_file, lock, endpoint=server.url, file_floor_s=60, hub_deadline_s=2
    )
    assert code == 5, err
    line = _line(err)
    assert re.fullmatch(
        rf"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {re.escape(server.url)}: 2 of 2 files out of tries, first "
        r"config.json after 1: the sync's deadline of 2 s passed at byte \d+ of \d+ \(the rest are in place; a "
        r"run again resumes\)",
        line,
    ), line
    assert sorted(result["files"]) == ["config.json", NAME]
    assert seconds < 15, seconds
    print(f"every file dripping: the sync ended in {seconds:.1f} s")


@pytest.mark.parametrize("retry_after", [1, 1799])
def test_a_hub_that_429s_every_get_is_down_within_the_sync_s_wait_budget(
    tmp_path: Path, key_file: Path, shard_hub: tuple[HubServer, dict[str, list[Any]]], retry_after: int
) -> None:
    """The Hub answers every shard's metadata and 429s every GET of its bytes: one wait budget for
    the whole sync (not one per file), and failed GETs count toward the Hub being down."""
    server, lock = shard_hub
    write_faults(
        tmp_path / "hub",
        {
            "fail": [
                {"path": "*.safetensors", "method": "GET", "status": 429, "retry_after": retry_after, "times": 100_000},
            ]
        },
    )
    code, result, err, seconds, _ = _sync(tmp_path, key_file, lock, endpoint=server.url, hub_wait_budget_s=3)
    assert code == 5, err
    line = _line(err)
    assert line.startswith(
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {server.url}: the Hub is down: GET answered "
        f"429 Too Many Requests (Retry-After {retry_after}); waiting "
    )
    assert " would pass the sync's wait budget of 3 s, and nothing but errors for " in line
    assert re.search(r"; \d+ of 97 files not fetched, first \S+ \(the rest are in place; a run again resumes\)$", line)
    assert not [rel for rel in result["fetched"] if rel.startswith("model-")]
    gets = server.stats.snapshot()["requests"]["GET cdn"]
    assert gets < 60, gets  # eight files at once, each a few tries within the budget; most never asked
    assert seconds < 20, seconds
    print(f"429 on every GET, Retry-After {retry_after}: down in {seconds:.1f} s after {gets} GETs")


def test_a_retry_after_that_is_no_ascii_number_means_backoff(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """``Retry-After: ²`` (a digit to ``str.isdigit``, not to ``float``): no wait asked."""
    server, lock = small_hub
    write_faults(
        tmp_path / "hub",
        {
            "fail": [
                {"path": NAME, "method": "GET", "status": 503, "headers": {"Retry-After": "\u00b2"}, "times": 1},
            ]
        },
    )
    code, result, err, _, _ = _sync(tmp_path, key_file, lock, endpoint=server.url)
    assert code == 0, err
    assert sorted(result["fetched"]) == ["config.json", NAME]
    (retry,) = _retries(tmp_path, NAME)
    assert retry.startswith("GET answered 503 Service Unavailable (Retry-After '\\xb2'); retry 1 of 6 in "), retry
    assert float(retry.split(" in ", 1)[1].split(" s,", 1)[0]) < 1  # the backoff's, from 0.05 s


def test_a_ratelimit_reset_of_thousands_of_digits_waits_the_budget_at_most(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """A 429 whose ``RateLimit`` reset is 5,000 digits long: a wait capped at the sync's budget."""
    server, lock = small_hub
    reset = "9" * 5000
    write_faults(
        tmp_path / "hub",
        {
            "fail": [
                {
                    "path": NAME,
                    "method": "GET",
                    "status": 429,
                    "times": 1,
                    "headers": {"RateLimit": f'"resolvers";r=0;t={reset}'},
                },
            ]
        },
    )
    code, result, err, seconds, _ = _sync(tmp_path, key_file, lock, endpoint=server.url, hub_wait_budget_s=2)
    assert code == 0, err
    assert sorted(result["fetched"]) == ["config.json", NAME]
    (retry,) = _retries(tmp_path, NAME)
    assert retry.startswith("GET answered 429 Too Many Requests; retry 1 of 6 in 2.0 s, "), retry
    assert seconds < 15, seconds


def _mirror_sync(tmp_path: Path, key: Path, server: HubServer, lock: dict[str, list[Any]], **more: Any) -> Any:
    return _sync(
        tmp_path, key, lock, endpoint=server.url, peers=[{"host": "mirror", "path": str(tmp_path / "mirror")}], **more
    )


def test_a_mirror_file_longer_than_the_lock_gets_nothing_past_the_size_written(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = small_hub
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / NAME).write_bytes(WEIGHTS + bytes(64 << 20))
    (tmp_path / "mirror" / "config.json").write_bytes(CONFIG)
    code, result, err, seconds, largest = _mirror_sync(tmp_path, key_file, server, lock)
    assert code == 0, err
    assert result["peer_failures"] == {NAME: f"mirror: Mismatch: the source sent more than the locked {SIZE} bytes"}
    assert result["fetched"] == [NAME]  # from the Hub, then
    assert (tmp_path / "revision" / NAME).read_bytes() == WEIGHTS
    assert largest <= SIZE
    print(f"mirror past the size: ended in {seconds:.1f} s, the partial file at most {largest} bytes")


def test_a_mirror_that_drips_ends_at_the_file_s_deadline(
    tmp_path: Path, key_file: Path, small_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = small_hub
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "config.json").write_bytes(CONFIG)
    os.mkfifo(mirror / NAME)
    done = threading.Event()

    def drip() -> None:
        # Opened without blocking, retried: threads here are gevent's, and a blocking open of a
        # pipe no one reads yet would hold the whole process.
        while not done.wait(0.05):
            try:
                pipe = os.open(mirror / NAME, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                continue
        else:
            return
        with contextlib.suppress(OSError):
            for byte in WEIGHTS:
                if done.wait(0.2):
                    break
                os.write(pipe, bytes([byte]))
        os.close(pipe)

    writer = threading.Thread(target=drip, daemon=True)
    writer.start()
    try:
        code, result, err, seconds, largest = _mirror_sync(tmp_path, key_file, server, lock, file_floor_s=1.5)
    finally:
        done.set()
    assert code == 0, err
    cause = result["peer_failures"][NAME]
    assert re.fullmatch(
        rf"mirror: TimeoutError: the file's deadline of 1.5 s passed at byte \d+ of {SIZE} \(the "
        r"longer of 1.5 s and its size at 1048576 bytes/s\)",
        cause,
    ), cause
    assert result["fetched"] == [NAME]
    assert (tmp_path / "revision" / NAME).read_bytes() == WEIGHTS
    assert largest <= SIZE
    assert seconds < 15, seconds
    print(f"mirror drip: ended in {seconds:.1f} s")
