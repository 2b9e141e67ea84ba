"""The all-reduce check on a 2-host SGLang instance, on a cluster of its own, with real torch.

The engine release pins torch (the CPU build: the test hosts have no GPU), so the check runs the
real torch.distributed job, with gloo instead of NCCL, across both hosts: the rendezvous on the
leader, one rank per host, every value checked, the bus bandwidth measured and compared with the
recipe's threshold, before either engine (re)starts. A threshold the hosts cannot reach fails the
converge on both hosts, naming the instance, the figure and the threshold, and leaves the release
that was serving untouched; so does a rendezvous port the worker cannot reach, which the
communication check names before the all-reduce starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.demo_recipes import recipe_for
from harness.own_cluster import OwnCluster, Run, in_deploy
from tests.e2e.demo import chat, host_lines, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

# torch 2.13.0's CPU build (pip takes it from the file in its find-links; PyPI has only CUDA builds),
# and what it depends on, in the cluster's package index
AR = OwnCluster(
    {
        "KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-allreduce",
        "KIMI_CLUSTER_SUBNET": "10.213.14.0/24",
        "KIMI_CLUSTER_PACKAGES": "torch==2.13.0+cpu",
    }
)
AR_DIR = AR.dir
HOSTS = ("kimi-h1", "kimi-h2")
UNIT = "/etc/systemd/system/kimi-sglang.service"


@pytest.fixture(scope="module")
def ar_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with AR.fresh("b300x8,b300x8", tmp_path_factory.mktemp("allreduce")) as st:
        yield st


def _converge(st: dict[str, Any], recipe: Path, deploy: str = "deploys/kimi.py") -> Run:
    return AR.pyinfra(AR.inventory(st["dir"] / "ar.py", recipe, "demo_ar = _hosts"), deploy=deploy)


def _failed(run: Run) -> dict[str, list[str]]:
    """Operation -> hosts that failed it, from the log (with every host failed, pyinfra prints no
    JSON): those that said why (``[host] kimi-deploy: ...``, pyinfra's own Error line then left
    out) or for which pyinfra said only that it failed."""
    out: dict[str, set[str]] = {}
    op = ""
    for line in run.log.splitlines():
        if line.startswith("--> Starting operation: "):
            op = in_deploy(line.split(": ", 1)[1].strip())
        found = re.search(r"\[(kimi-h\d)\] (?:Error: |kimi-deploy: )", line)
        if found:
            out.setdefault(op, set()).add(found.group(1))
    return {name: sorted(hosts) for name, hosts in out.items()}


def _lines(run: Run) -> dict[str, str]:
    """The all-reduce check's first line for each host that printed one."""
    return {h: lines[0] for h, lines in host_lines(run.log, "kimi-deploy: all-reduce: ", HOSTS).items() if lines}


def _sh(st: dict[str, Any], host: str, command: str) -> str:
    return ssh(host, command, cluster_state=st)


def _state(st: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Per host: the engine's PID, its unit file's digest and the current release."""
    return {
        h: (
            _sh(st, h, "systemctl show -p MainPID --value kimi-sglang"),
            _sh(st, h, f"sha256sum {UNIT}"),
            _sh(st, h, "readlink /opt/kimi/current"),
        )
        for h in HOSTS
    }


def _answers(st: dict[str, Any]) -> None:
    leader = next(h["address"] for h in st["hosts"] if h["name"] == "kimi-h1")
    answer = chat(f"http://{leader}:30000", "Reply with exactly the word READY and nothing else.", AR_DIR / "api-key")
    assert answer["choices"][0]["message"]["content"] == "READY"


@pytest.fixture(scope="module")
def serving(ar_cluster: dict[str, Any]) -> dict[str, Any]:
    run = _converge(ar_cluster, recipe_for(AR, ar_cluster["dir"], 0.001))
    assert run.code == 0, run.log[-4000:]
    ar_cluster["first"] = run
    return ar_cluster


def _logged(st: dict[str, Any], host: str) -> list[dict[str, Any]]:
    """The all-reduce results ``host`` kept, oldest first."""
    lines = _sh(st, host, "cat /var/log/kimi/all-reduce.log").splitlines()
    return [json.loads(line.split(" ", 1)[1]) for line in lines]


def test_the_instance_all_reduces_with_the_release_torch_before_its_engines_start(serving: dict[str, Any]) -> None:
    run: Run = serving["first"]
    assert sorted(run.changed()["All-reduce check"]) == list(HOSTS)
    assert "torch==2.13.0+cpu" in _sh(serving, "kimi-h1", "cat /opt/kimi/current/engine/.kimi-lock.txt")
    results = {h: _logged(serving, h)[-1] for h in HOSTS}
    for host, result in results.items():
        assert (result["host"], result["ok"], result["world"], result["torch"]) == (host, True, 2, "2.13.0+cpu")
        assert result["interface"] == "eth0"  # the ranks' traffic pinned to the host's kimi_address
        assert [r["size_bytes"] for r in result["rows"]] == [2**20, 2**21, 2**22, 2**23]
        assert all(r["wrong"] == 0 and r["busbw_gbs"] > 0 for r in result["rows"])
        # gloo between two hosts: each rank sends and receives its half, busbw = algbw x 2(n-1)/n = algbw
        assert all(r["busbw_gbs"] == r["algbw_gbs"] for r in result["rows"])
    assert results["kimi-h1"]["rows"] == results["kimi-h2"]["rows"]  # the slowest rank's time, on both
    _answers(serving)
    # Nothing restarts on the next converge: nothing to check.
    again = _converge(serving, recipe_for(AR, serving["dir"], 0.001))
    assert again.code == 0, again.log[-3000:]
    assert "All-reduce check" not in again.changed()
    # Alone, the check runs beside the serving engines and changes nothing.
    before = _state(serving)
    alone = _converge(serving, recipe_for(AR, serving["dir"], 0.001), deploy="deploys/commcheck.py")
    assert alone.code == 0, alone.log[-3000:]
    assert sorted(alone.changed()["All-reduce check"]) == list(HOSTS)
    assert _state(serving) == before


def test_a_threshold_the_hosts_cannot_reach_stops_the_converge_on_both(serving: dict[str, Any]) -> None:
    before = _state(serving)
    run = _converge(serving, recipe_for(AR, serving["dir"], 10000, generation="2"))
    assert run.code != 0
    assert _failed(run) == {"All-reduce check": list(HOSTS)}
    lines = _lines(run)
    assert set(lines) == set(HOSTS), run.log[-3000:]
    figure = re.fullmatch(
        r"demo-ar/serve#0 on kimi-h1, kimi-h2 \(2 ranks, gloo\): bus bandwidth (\S+) GB/s at 8 MiB, needs >= 10000 GB/s",
        lines["kimi-h1"],
    )
    assert figure, lines
    assert 0 < float(figure.group(1)) < 10000
    assert lines["kimi-h2"] == lines["kimi-h1"]  # the same measurement, reduced across the ranks
    assert _state(serving) == before
    _answers(serving)


@pytest.fixture
def rendezvous_blocked(serving: dict[str, Any]) -> Iterator[None]:
    worker = next(h["address"] for h in serving["hosts"] if h["name"] == "kimi-h2")
    _sh(
        serving,
        "kimi-h1",
        "nft add table inet kimitest && nft add chain inet kimitest input "
        f"'{{ type filter hook input priority 0; }}' && nft add rule inet kimitest input ip saddr {worker} "
        "tcp dport 29498 drop",
    )
    try:
        yield
    finally:
        _sh(serving, "kimi-h1", "nft delete table inet kimitest")


def test_a_rendezvous_the_worker_cannot_reach_is_named_before_the_all_reduce(
    serving: dict[str, Any], rendezvous_blocked: None
) -> None:
    before = _state(serving)
    logged = {h: len(_logged(serving, h)) for h in HOSTS}
    run = _converge(serving, recipe_for(AR, serving["dir"], 0.001, generation="3"))
    assert run.code != 0
    assert _failed(run) == {"Communication check": list(HOSTS)}
    assert "kimi-h2 -> kimi-h1:29498 (all-reduce rendezvous): timed out" in run.log
    assert {h: len(_logged(serving, h)) for h in HOSTS} == logged  # the all-reduce never started
    assert _state(serving) == before
    _answers(serving)
