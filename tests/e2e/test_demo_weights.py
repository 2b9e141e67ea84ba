"""Weights on the demo cluster: damage is found and repaired alone, counted in bytes the Hub sent.

Each test damages the weights of kimi-h1 (a vLLM host) in one way and converges again. The Hub's
own counters say which files it served: only the damaged ones.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.demo import ROOT, address, chat, pyinfra, ssh, state

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

REVISION = "707b75098b7cd8ff771cbef11deb78f502e0ba34"
WEIGHTS = f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION}"
SHARD_57 = "model-00057-of-00096.safetensors"
REVISION_B = "70e42530909446fa6a1a8292794d0638293ad679"
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
    ssh("kimi-h1", f"cd {WEIGHTS} && python3 -c \"import os; p='{SHARD_57}'; st=os.stat(p); "
        "f=open(p,'r+b'); f.seek(st.st_size//2); b=f.read(1); f.seek(st.st_size//2); "
        "f.write(bytes([b[0]^1])); f.close(); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))\"")  # fmt: skip
    assert "Weights at the pinned revision" not in _converge()
    assert _served() == {}
    changed = _converge("--limit", "kimi-h1", "--data", "kimi_verify=full")
    assert changed["Weights at the pinned revision"] == ["kimi-h1"]
    served = _served()
    assert list(served) == [SHARD_57]


@pytest.mark.parametrize(
    ("damage", "repaired"),
    [
        (f"truncate -s 100 {SHARD_57}", [SHARD_57]),
        (f"rm {SHARD_57}", [SHARD_57]),
        ("echo stray > extra.bin", []),
        ("mkdir -p .cache/huggingface/download && echo half > .cache/huggingface/download/x.incomplete", []),
    ],
    ids=["truncated", "deleted", "extra-file", "orphaned-partial"],
)
def test_damage_is_repaired_by_a_normal_run(converged: None, damage: str, repaired: list[str]) -> None:
    ssh("kimi-h1", f"cd {WEIGHTS} && {damage}")
    changed = _converge()
    assert changed["Weights at the pinned revision"] == ["kimi-h1"]
    assert list(_served()) == repaired
    files = ssh("kimi-h1", f"cd {WEIGHTS} && find . -type f -not -path './.kimi/*' -not -path './.cache/*' | wc -l")
    assert files == "103"
    assert ssh("kimi-h1", f"cd {WEIGHTS} && find . -name '*.incomplete' -o -name extra.bin | wc -l") == "0"
    # And the next run has nothing left to do.
    assert "Weights at the pinned revision" not in _converge()


def test_upgrade_fetches_only_what_changed_and_rollback_fetches_nothing(converged: None, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    data["model"]["revision"] = REVISION_B
    upgraded = tmp_path / "demo-b.yaml"
    upgraded.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        changed = _converge("--data", f"kimi_recipe={upgraded}")
        assert changed["Weights at the pinned revision"] == list(ENGINE_HOSTS)
        # Commit B changed three shards and config.json and added extra_b.json; the rest is linked.
        per_host = {path: n for path, n in _hub("/_stats")["downloads"].items() if n}
        assert sorted(per_host) == sorted(CHANGED_IN_B)
        assert set(per_host.values()) == {len(ENGINE_HOSTS)}
        assert (
            "READY"
            in chat(f"http://{address('kimi-h1')}:8000", "Reply with exactly the word READY and nothing else.")[
                "choices"
            ][0]["message"]["content"]
        )
    finally:
        _hub("/_stats/reset", "POST")
        back = _converge()
        for host in ENGINE_HOSTS:  # leave the hosts as the other tests expect them: revision A only
            ssh(host, "rm", "-rf", f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION_B}")
    assert back["Services"]  # the engines went back to revision A...
    assert "Weights at the pinned revision" not in back
    assert _served() == {}  # ...without a byte from the Hub
