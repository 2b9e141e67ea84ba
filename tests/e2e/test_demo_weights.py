"""Weights on the demo cluster: damage is found and repaired alone, counted in bytes the Hub sent.

Each test damages the weights of kimi-h1 (a vLLM host) in one way and converges again. The Hub's
own counters say which files it served: only the damaged ones, or none when the other hosts of the
run hold them verified (download once, fan out).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.own_cluster import BIN, ROOT
from kimi_deploy.render.scrub_units import PROGRESS_LOG
from localcluster.hub import write_faults
from tests.e2e.demo import GPU_RECIPE, STATE_DIR, address, chat, gpu_recipe_data, main_pid, pyinfra, ssh, state

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

REVISION = "23eb01d77aab1f1b9ff6dda80033b783970fe79c"
WEIGHTS = f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION}"
SHARD_57 = "model-00057-of-00096.safetensors"
REVISION_B = "1088b4b0a968514a4de7da23014f7058bbfbd30c"
ENGINE_HOSTS = ("kimi-h1", "kimi-h2", "kimi-h3", "kimi-h4")
CHANGED_IN_B = [
    "config.json",
    "extra_b.json",
    "model-00007-of-00096.safetensors",
    "model-00057-of-00096.safetensors",
    "model-00090-of-00096.safetensors",
]


def _hub(path: str, method: str = "GET") -> dict[str, Any]:
    url = state()["services"]["hub"]["url"] + path
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read() or b"{}")
        return data


def _served() -> dict[str, int]:
    """Files the Hub sent bodies for since the last reset, with the bytes sent."""
    return {path: n for path, n in _hub("/_stats")["bytes"].items() if n}


@pytest.fixture
def converged(demo_cluster: None) -> None:
    run = pyinfra()
    assert run.code == 0, run.log[-3000:]
    _hub("/_stats/reset", "POST")


def _converge(*extra: str) -> dict[str, list[str]]:
    run = pyinfra(*extra)
    assert run.code == 0, run.log[-3000:]
    return run.changed()


def test_bit_flip_with_mtime_kept_is_missed_by_a_normal_run_and_found_by_a_full_verify(converged: None) -> None:
    # Flip one byte in the middle of shard 57 and put its mtime back: size, mtime, inode unchanged.
    ssh(
        "kimi-h1",
        f"cd {WEIGHTS} && python3 -c \"import os; p='{SHARD_57}'; st=os.stat(p); "
        "f=open(p,'r+b'); f.seek(st.st_size//2); b=f.read(1); f.seek(st.st_size//2); "
        'f.write(bytes([b[0]^1])); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))"',
    )
    assert "Weights at the pinned revision" not in _converge()
    assert _served() == {}
    changed = _converge("--limit", "kimi-h1", "--data", "kimi_verify=full")
    assert changed["Weights at the pinned revision"] == ["kimi-h1"]
    served = _served()
    assert list(served) == [SHARD_57]


@pytest.mark.parametrize(
    ("damage", "repaired", "read_by_the_engine"),
    [
        (f"truncate -s 100 {SHARD_57}", [SHARD_57], True),
        (f"rm {SHARD_57}", [SHARD_57], True),
        # the engines run as a user of their own: a shard they cannot read is damage too
        (f"chmod 000 {SHARD_57}", [], True),
        ("echo stray > extra.bin", [], False),
        ("mkdir -p .cache/huggingface/download && echo half > .cache/huggingface/download/x.incomplete", [], False),
    ],
    ids=["truncated", "deleted", "unreadable", "extra-file", "orphaned-partial"],
)
def test_damage_is_repaired_by_a_normal_run(
    converged: None, damage: str, repaired: list[str], read_by_the_engine: bool
) -> None:
    pid = main_pid("kimi-h1", "kimi-vllm")
    ssh("kimi-h1", f"cd {WEIGHTS} && {damage}")
    changed = _converge()
    # An engine whose files were missing, changed or unreadable restarts on the repaired ones; an
    # extra file or a partial download is nothing it read.
    assert (main_pid("kimi-h1", "kimi-vllm") != pid) == read_by_the_engine
    assert ssh("kimi-h1", f"stat -c %a {WEIGHTS}/{SHARD_57}") == "644"
    if repaired:
        # The other hosts hold the shard verified: kimi-h1 fetches it from them, not from the Hub.
        assert changed["Weights at the pinned revision"] == ["kimi-h1"]
        assert _served() == {}
        last = ssh("kimi-h1", "tail -n 1 /var/log/kimi/weights.log")
        assert f": {len(repaired)} files from peers (" in last, last
    elif read_by_the_engine:
        # A file that is whole but unreadable: the sync (set up to take it from peers) gives it
        # its mode back and fetches nothing.
        assert changed["Weights at the pinned revision"] == ["kimi-h1"]
        assert _served() == {}
    else:
        assert changed["Weights at the pinned revision"] == ["kimi-h1"]
        assert _served() == {}
    files = ssh("kimi-h1", f"cd {WEIGHTS} && find . -type f -not -path './.kimi/*' -not -path './.cache/*' | wc -l")
    assert files == "103"
    assert ssh("kimi-h1", f"cd {WEIGHTS} && find . -name '*.incomplete' -o -name extra.bin | wc -l") == "0"
    # And the next run has nothing left to do.
    assert "Weights at the pinned revision" not in _converge()


def test_upgrade_fetches_only_what_changed_and_rollback_fetches_nothing(converged: None, tmp_path: Path) -> None:
    data = gpu_recipe_data()
    data["model"]["revision"] = REVISION_B
    upgraded = tmp_path / "demo-b.yaml"
    upgraded.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        changed = _converge("--data", f"kimi_recipe={upgraded}")
        # One step: kimi-h1 from the Hub while the others take each file from the host before them.
        assert changed["Weights at the pinned revision"] == list(ENGINE_HOSTS)
        # Commit B changed three shards and config.json and added extra_b.json; the rest is linked
        # from revision A on each host, and each changed file leaves the Hub once for all hosts.
        downloads = {path: n for path, n in _hub("/_stats")["downloads"].items() if n}
        assert sorted(downloads) == sorted(CHANGED_IN_B)
        assert set(downloads.values()) == {1}
        assert (
            "READY"
            in chat(f"http://{address('kimi-h1')}:8000", "Reply with exactly the word READY and nothing else.")[
                "choices"
            ][0]["message"]["content"]
        )
    finally:
        _hub("/_stats/reset", "POST")
        back = _converge()
        kept = ssh("kimi-h1", "ls /srv/models/moonshotai--Kimi-K3.1-Pro-Tiny")
        for host in ENGINE_HOSTS:  # leave the hosts as the other tests expect them: revision A only
            ssh(host, "rm", "-rf", f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION_B}")
    assert back["Services: leaders"]  # the engines went back to revision A...
    assert "Weights at the pinned revision" not in back
    assert _served() == {}  # ...without a byte from the Hub
    assert kept.split() == sorted([REVISION, REVISION_B])  # and B stays, the rollback copy


@pytest.fixture
def hub_faults() -> Iterator[Callable[[dict[str, Any]], None]]:
    root = STATE_DIR / "hub"

    def set_faults(faults: dict[str, Any]) -> None:
        write_faults(root, faults)

    try:
        yield set_faults
    finally:
        write_faults(root, None)


def test_a_hub_serving_a_corrupted_shard_is_retried_then_named(
    converged: None, hub_faults: Callable[[dict[str, Any]], None]
) -> None:
    pid = main_pid("kimi-h1", "kimi-vllm")
    hub_faults({"corrupt": [SHARD_57]})
    ssh("kimi-h1", f"rm {WEIGHTS}/{SHARD_57}")
    run = pyinfra("--limit", "kimi-h1")
    assert run.code != 0
    (line,) = [x.strip() for x in run.log.splitlines() if "[kimi-h1] kimi-deploy:" in x]
    assert f"{SHARD_57} does not match the lock after retries: expected sha256:" in line
    assert line.split("found ")[1].startswith("sha256:")
    assert _hub("/_stats")["downloads"][SHARD_57] == 3  # the first download and two retries
    assert main_pid("kimi-h1", "kimi-vllm") == pid  # nothing was restarted
    hub_faults({})
    # With the other hosts in the run, kimi-h1 takes the shard from one that holds it verified.
    assert _converge()["Weights at the pinned revision"] == ["kimi-h1"]


def test_a_hub_that_rate_limits_fails_and_resets_a_transfer_is_ridden_out(
    converged: None, hub_faults: Callable[[dict[str, Any]], None]
) -> None:
    """One 429 on a shard's metadata, one 503 on another's bytes, a reset halfway through a third:
    the converge completes, each of those is asked for once more, and the host's progress log
    names every retry."""
    shards = {n: f"model-{n:05d}-of-00096.safetensors" for n in (12, 57, 80)}
    ssh("kimi-h1", "rm", *(f"{WEIGHTS}/{name}" for name in shards.values()))
    hub_faults(
        {
            "fail": [
                {"path": shards[57], "method": "HEAD", "status": 429, "retry_after": 1, "times": 1},
                {"path": shards[12], "method": "GET", "status": 503, "times": 1},
                {"path": shards[80], "method": "GET", "reset_at": 0.5, "times": 1},
            ]
        }
    )
    started = ssh("kimi-h1", f"wc -l < {PROGRESS_LOG} 2>/dev/null || echo 0")
    # kimi-h1 alone, so the shards come from the Hub (with its peers in the run, they would give them).
    assert _converge("--limit", "kimi-h1")["Weights at the pinned revision"] == ["kimi-h1"]
    stats = _hub("/_stats")
    assert sorted(stats["starts"]) == sorted(shards.values())
    assert stats["starts"][shards[12]] == stats["starts"][shards[57]] == [0]
    first, then = stats["starts"][shards[80]]
    assert (first, then > 0) == (0, True)  # the rest of it, not the whole again
    log = ssh("kimi-h1", f"tail -n +{int(started) + 1} {PROGRESS_LOG}")
    retried = [line for line in log.splitlines() if "; retry 1 of " in line]
    assert len(retried) == 3, log
    assert any(f"{shards[57]}: HEAD answered 429 Too Many Requests (Retry-After 1)" in x for x in retried)
    assert any(f"{shards[12]}: GET answered 503 Service Unavailable" in x for x in retried)
    assert any(f"{shards[80]}: " in x and f"from byte {then} of " in x for x in retried)
    hub_faults({})
    assert "Weights at the pinned revision" not in _converge("--limit", "kimi-h1")  # verified, in place


def test_a_killed_sync_resumes_without_fetching_finished_files_again(
    converged: None, hub_faults: Callable[[dict[str, Any]], None]
) -> None:
    ssh("kimi-h1", f"rm -rf {WEIGHTS}")
    # each file's body at 60 kB/s: the sync takes 8 files at once (weights_sync.HUB_AT_ONCE), so the
    # 6 MB revision takes about 12 s, and the kill below finds it well before its end
    hub_faults({"slow_bytes_per_s": 60_000})
    run = subprocess.Popen(
        [
            str(BIN / "pyinfra"),
            "inventories/demo.py",
            "deploys/kimi.py",
            "-y",
            "--limit",
            "kimi-h1",
            "--data",
            f"kimi_recipe={GPU_RECIPE}",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = int(ssh("kimi-h1", f"ls {WEIGHTS} 2>/dev/null | grep -c safetensors || true") or 0)
            if done >= 20:
                break
            time.sleep(0.2)
        assert 20 <= done < 96, done
        # The sync runs with the tools venv's python (anchored: pkill must not match its own shell).
        ssh("kimi-h1", "pkill -9 -f '^/opt/kimi/tools/huggingface_hub'")
    finally:
        run.wait(timeout=120)
    first = dict(_hub("/_stats")["downloads"])
    hub_faults({})
    _hub("/_stats/reset", "POST")
    # kimi-h1 alone, so the rest comes from the Hub (with its peers in the run, they would give it).
    assert _converge("--limit", "kimi-h1")["Weights at the pinned revision"] == ["kimi-h1"]
    again = {path for path, n in _hub("/_stats")["downloads"].items() if n}
    finished = {path for path, n in first.items() if n} - again
    # Shards finished before the kill were verified, not fetched again; only the rest came now.
    assert len(finished) >= 19
    assert len(again) + len(finished) >= 103


def test_the_hub_token_reaches_the_hosts_only_in_a_root_only_file(converged: None) -> None:
    token = "hf_kimiDeployTestToken0123456789"
    ssh("kimi-h1", "rm", "-f", "/etc/kimi/secrets/hf-token")
    run = pyinfra("--limit", "kimi-h1", env={"HF_TOKEN": token})
    assert run.code == 0, run.log[-3000:]
    assert run.changed()["Hub token"] == ["kimi-h1"]
    assert token not in run.log  # not in pyinfra's output, its --json payload included
    assert ssh("kimi-h1", "stat -c '%a %U' /etc/kimi/secrets/hf-token") == "600 root"
    assert ssh("kimi-h1", "cat", "/etc/kimi/secrets/hf-token") == token
    assert ssh("kimi-h1", "stat -c '%a %U %G' /etc/kimi/secrets") == "750 root kimi"
    hub_log = (STATE_DIR / "logs" / "hub.log").read_text(encoding="utf-8", errors="replace")
    assert token not in hub_log
    again = pyinfra("--limit", "kimi-h1", env={"HF_TOKEN": token})
    assert "Hub token" not in again.changed()
    ssh("kimi-h1", "rm", "/etc/kimi/secrets/hf-token")


def _journal_cursor(host: str) -> str:
    """Where the host's journal stands now: what is logged later comes after it."""
    shown = ssh(host, "journalctl -n 0 --show-cursor --no-pager")
    return shown.strip().rsplit("-- cursor: ", 1)[1]


def _served_by_peers(host: str, after: str) -> dict[str, int]:
    """Files the host's peer service sent to others since the journal cursor ``after``, whole or
    relayed as they arrived (from its journal: an earlier test's lines stay out, however recent)."""
    cursor = shlex.quote(after)
    lines = ssh(
        host,
        f"journalctl -u kimi-weights-peer --after-cursor={cursor} -o cat --no-pager "
        "| grep -E '^(served|relayed) ' || true",
    )
    out: dict[str, int] = {}
    for line in lines.splitlines():
        if line.startswith(("served ", "relayed ")) and " bytes) to " in line:
            name = line.split()[1]
            out[name] = out.get(name, 0) + 1
    return out


def test_fan_out_on_four_hosts_takes_each_file_from_the_hub_once(converged: None) -> None:
    cursors = {}
    for host in ENGINE_HOSTS:
        ssh(host, f"rm -rf {WEIGHTS}")
        cursors[host] = _journal_cursor(host)
    changed = _converge()
    # One step: kimi-h1 from the Hub while the others take each file from the host before them.
    assert changed["Weights at the pinned revision"] == list(ENGINE_HOSTS)
    downloads = {path: n for path, n in _hub("/_stats")["downloads"].items() if n}
    assert len(downloads) == 103
    assert set(downloads.values()) == {1}
    # A chain: kimi-h1 gave every file once (to kimi-h2), which gave it once to kimi-h3, and so
    # on; no host's link carried the revision twice. Then they stopped listening.
    for host in ENGINE_HOSTS[:-1]:
        served = _served_by_peers(host, cursors[host])
        assert (len(served), set(served.values())) == (103, {1}), host
    assert _served_by_peers(ENGINE_HOSTS[-1], cursors[ENGINE_HOSTS[-1]]) == {}
    assert ssh("kimi-h1", "systemctl is-active kimi-weights-peer || true") in ("inactive", "unknown")
    assert "8479" not in ssh("kimi-h1", "ss -ltnH")
    assert ssh("kimi-h1", "stat -c '%a %U %G' /etc/kimi/secrets/weights-transfer-key") == "440 root kimi"
    for host in ENGINE_HOSTS:
        count = ssh(host, f"cd {WEIGHTS} && find . -type f -not -path './.kimi/*' -not -path './.cache/*' | wc -l")
        assert count == "103", host
    again = _converge()
    assert not {"Weights at the pinned revision", "Weights served to peers"} & set(again)


def test_the_scrub_timer_finds_a_bit_flip_and_refetches_that_shard_only(converged: None) -> None:
    assert ssh("kimi-h2", "systemctl is-enabled kimi-weights-scrub.timer") == "enabled"
    assert ssh("kimi-h2", "systemctl is-active kimi-weights-scrub.timer") == "active"
    ssh(
        "kimi-h2",
        f"cd {WEIGHTS} && python3 -c \"import os; p='{SHARD_57}'; st=os.stat(p); "
        "f=open(p,'r+b'); f.seek(st.st_size//2); b=f.read(1); f.seek(st.st_size//2); "
        'f.write(bytes([b[0]^1])); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))"',
    )
    ssh("kimi-h2", "systemctl start kimi-weights-scrub.service")  # a oneshot: returns when done
    journal = ssh("kimi-h2", "journalctl -u kimi-weights-scrub -o cat --no-pager -n 50")
    assert f"kimi-deploy: scrub: {SHARD_57}: expected sha256:" in journal
    assert "kimi-deploy: scrub: re-fetched 1 corrupted files" in journal
    assert list(_served()) == [SHARD_57]
    report = json.loads(ssh("kimi-h2", f"cat {WEIGHTS}/.kimi/scrub.json"))
    assert list(report["corrupted"]) == [SHARD_57]
    assert report["repaired"] == [SHARD_57]
    assert "Weights at the pinned revision" not in _converge()  # the repaired file is verified


def test_revisions_neither_served_nor_the_rollback_copy_are_collected(converged: None) -> None:
    orphan = "/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/" + "c" * 40
    ssh("kimi-h3", f"mkdir -p {orphan}/.kimi && echo x > {orphan}/model.bin")
    changed = _converge()
    assert changed["Old revisions collected"] == ["kimi-h3"]
    assert ssh("kimi-h3", "ls /srv/models/moonshotai--Kimi-K3.1-Pro-Tiny") == REVISION
    assert "Old revisions collected" not in _converge()
