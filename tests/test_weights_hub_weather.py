"""The Hub's weather, run locally: a 96-shard revision from the fake Hub answering as the Hub does
when it rate-limits, fails or drops a transfer (``"fail"`` in its faults), fetched by
``hostside/weights_sync.py`` with the real huggingface_hub client.

One 429 on a shard's metadata, one 503 on another's bytes and a connection reset halfway through a
third: the sync completes, those files are asked for once more (the third from where it broke),
every other file once, and the progress log names each retry. The bytes come through the Hub's
HTTP path (its CDN, another origin), though the Hub advertises Xet for each shard. A file out of tries stops no other,
and fails the sync in one line naming it; what a run left half-fetched, the next resumes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.revision_files import partial_path
from localcluster.hub import HubServer, serve, write_faults
from tests.test_weights_hub_relay import COMMIT, REPO, _write_repo
from tests.test_weights_peer import key_file
from tests.test_weights_relay import _sync_proc

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

__all__ = ["key_file"]  # the fixture, shared

SHARD_SIZE = 96 << 10
SHARDS = {f"model-{n:05d}-of-00096.safetensors": os.urandom(SHARD_SIZE) for n in range(1, 97)}
SHARD_12, SHARD_57, SHARD_80 = (f"model-{n:05d}-of-00096.safetensors" for n in (12, 57, 80))
CONFIG = b'{"model_type": "kimi_k3"}\n'


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, list[Any]]]]:
    files = {name: (data, True) for name, data in SHARDS.items()} | {"config.json": (CONFIG, False)}
    lock = _write_repo(tmp_path / "hub", files)
    server = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        yield server, lock
    finally:
        server.stop()


def _sync(
    tmp_path: Path, key: Path, server: HubServer, lock: dict[str, list[Any]], **more: Any
) -> tuple[int, Any, str]:
    proc = _sync_proc(
        tmp_path / "revision",
        lock,
        [],
        key,
        repo=REPO,
        revision=COMMIT,
        endpoint=server.url,
        retries=1,
        progress_log=str(tmp_path / "progress.log"),
        hub_backoff_s=0.05,
        **more,
    )
    out, err = proc.communicate(timeout=300)
    lines = out.splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else None, err


def _retries(tmp_path: Path) -> dict[str, list[str]]:
    """The progress log's retry lines, by file."""
    found: dict[str, list[str]] = {}
    log = tmp_path / "progress.log"
    for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
        match = re.search(r": (\S+): (.*; retry \d+ of \d+ in [0-9.]+ s, from byte \d+ of \d+)$", line)
        if match:
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def test_a_429_a_503_and_a_reset_are_each_retried_once_and_the_sync_completes(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = hub
    write_faults(
        tmp_path / "hub",
        {
            "fail": [
                {"path": SHARD_57, "method": "HEAD", "status": 429, "retry_after": 1, "times": 1},
                {"path": SHARD_12, "method": "GET", "status": 503, "times": 1},
                {"path": SHARD_80, "method": "GET", "reset_at": 0.5, "times": 1},
            ]
        },
    )
    code, result, err = _sync(tmp_path, key_file, server, lock)
    assert code == 0, err
    assert result["fetched"] == sorted(lock)
    for name, data in SHARDS.items():
        assert (tmp_path / "revision" / name).read_bytes() == data, name
    stats = server.stats.snapshot()
    # The HTTP path, though the Hub advertises Xet for every shard: no Xet token asked for.
    assert "GET xet_token" not in stats["requests"]
    assert stats["requests"]["GET cdn"] == len(SHARDS) + 2  # each shard once, two again
    files, starts = stats["files"], stats["starts"]
    # Every other shard: its metadata asked once, its bytes once, from byte 0.
    others = [n for n in SHARDS if n not in (SHARD_12, SHARD_57, SHARD_80)]
    heads, gets = files[f"HEAD {others[0]}"], files[f"GET {others[0]}"]
    assert {(files[f"HEAD {n}"], files[f"GET {n}"], tuple(starts[n])) for n in others} == {(heads, gets, (0,))}
    assert (files[f"HEAD {SHARD_57}"], files[f"GET {SHARD_57}"]) == (heads + 1, gets)  # the 429, asked again
    assert files[f"GET {SHARD_12}"] == gets + 1  # the 503, asked again
    assert starts[SHARD_12] == [0]  # (no body came with the 503)
    # The reset one: asked again for the rest, from where its bytes stopped arriving.
    first, then = starts[SHARD_80]
    assert (first, 0 < then <= SHARD_SIZE // 2) == (0, True)
    assert stats["bytes"][SHARD_80] == SHARD_SIZE // 2 + (SHARD_SIZE - then)
    retries = _retries(tmp_path)
    assert sorted(retries) == sorted([SHARD_12, SHARD_57, SHARD_80])
    (r57,), (r12,), (r80,) = retries[SHARD_57], retries[SHARD_12], retries[SHARD_80]
    assert r57.startswith("HEAD answered 429 Too Many Requests (Retry-After 1); retry 1 of 6 in ")
    # Retry-After honoured: one second, plus up to one of jitter (printed to a tenth).
    assert 1.0 <= float(r57.split(" in ", 1)[1].split(" s,", 1)[0]) <= 2.05
    assert r12.startswith("GET answered 503 Service Unavailable; retry 1 of 6 in ")
    assert r80.startswith("ReadError: ") or r80.startswith("RemoteProtocolError: "), r80
    assert r80.endswith(f"from byte {then} of {SHARD_SIZE}")


def test_a_file_out_of_tries_stops_no_other_and_is_named_in_one_line(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = hub
    write_faults(tmp_path / "hub", {"fail": [{"path": SHARD_12, "method": "GET", "status": 503, "times": 99}]})
    code, result, err = _sync(tmp_path, key_file, server, lock, hub_attempts=2)
    assert code == 5, err
    (line,) = [x for x in err.splitlines() if x.startswith("kimi-deploy: ")]
    assert line == (
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {server.url}: 1 of 97 files out of tries, first "
        f"{SHARD_12} after 3: GET answered 503 Service Unavailable (the rest are in place; a run again "
        "resumes)"
    )
    assert result["files"] == {SHARD_12: "GET answered 503 Service Unavailable"}
    assert sorted(result["fetched"]) == sorted(set(lock) - {SHARD_12})
    assert len(_retries(tmp_path)[SHARD_12]) == 2
    # The next run, the Hub well again, fetches that file alone.
    write_faults(tmp_path / "hub", None)
    server.stats.reset()
    code, result, err = _sync(tmp_path, key_file, server, lock)
    assert (code, result["fetched"]) == (0, [SHARD_12]), err
    assert server.stats.snapshot()["starts"] == {SHARD_12: [0]}


def test_what_a_failed_run_left_half_fetched_the_next_resumes(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    server, lock = hub
    write_faults(tmp_path / "hub", {"fail": [{"path": SHARD_80, "method": "GET", "reset_at": 0.5, "times": 1}]})
    code, _, err = _sync(tmp_path, key_file, server, lock, hub_attempts=0)  # out of tries at once
    assert code == 5, err
    held = Path(partial_path(str(tmp_path / "revision"), SHARD_80)).stat().st_size
    assert 0 < held <= SHARD_SIZE // 2
    # What the first run finished before it stopped (on a busy machine, not every other file).
    finished = {rel for rel in lock if (tmp_path / "revision" / rel).is_file()}
    server.stats.reset()
    code, result, err = _sync(tmp_path, key_file, server, lock)
    assert code == 0, err
    assert SHARD_80 in result["fetched"]
    assert not finished & set(result["fetched"])  # nothing fetched twice
    stats = server.stats.snapshot()
    assert stats["starts"][SHARD_80] == [held]  # the rest only
    assert stats["bytes"][SHARD_80] == SHARD_SIZE - held
    assert {rel: starts for rel, starts in stats["starts"].items() if rel != SHARD_80} == {
        rel: [0] for rel in result["fetched"] if rel != SHARD_80
    }
    assert (tmp_path / "revision" / SHARD_80).read_bytes() == SHARDS[SHARD_80]


def test_a_hub_that_answers_nothing_but_errors_is_down_and_the_sync_stops_soon(
    tmp_path: Path, key_file: Path, hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """The first file out of tries while no file got anything else: the others stop at their next
    try instead of each riding the outage out in turn."""
    server, lock = hub
    write_faults(tmp_path / "hub", {"down": True})
    code, result, err = _sync(tmp_path, key_file, server, lock, hub_attempts=2)
    assert code == 5, err
    (line,) = [x for x in err.splitlines() if x.startswith("kimi-deploy: ")]
    assert line.startswith(
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {server.url}: the Hub is down: HEAD answered "
        "503 Service Unavailable, and nothing but errors for "
    )
    assert line.endswith("; 97 of 97 files not fetched, first config.json (the rest are in place; a run again resumes)")
    assert result["fetched"] == []
    # Eight files at once, each tried three times at most; the rest never asked for.
    assert server.stats.snapshot()["requests_total"] <= 8 * 3
