"""Sixteen hosts from one controller, on a cluster of their own: the demo recipe grown to them
(``harness.fleet``: vLLM on twelve hosts, one SGLang instance across four), first converge to a
serving fleet with no error, each file of the revision sent once by the Hub for the whole run,
and a re-run in which no host takes any step. Then a port blocked between two of the SGLang hosts
is named by the communication check on all four, and nothing restarts. (bench/fleet.py runs the
same at 64 hosts and times it.)"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.fleet import FLEET, answers, bodies_served, endpoints, hub, inventory, sglang_hosts
from harness.own_cluster import ROOT, Run
from tests.e2e.demo import host_lines, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

HOSTS = 16
REVISION = "23eb01d77aab1f1b9ff6dda80033b783970fe79c"  # recipes/demo-gpu.yaml's


@dataclass(frozen=True)
class Fleet:
    inventory: Path
    # the first converge of the fresh hosts, and the bodies the Hub sent per file meanwhile
    first: Run
    served: dict[str, int]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Fresh hosts, up and converged once; down again at the end."""
    folder = tmp_path_factory.mktemp("fleet")
    FLEET.cli("down")
    FLEET.cli("up", "--hosts", str(HOSTS))
    try:
        inv = inventory(FLEET, folder, HOSTS)
        hub(FLEET, "/_stats/reset", "POST")
        first = FLEET.pyinfra(inv)
        yield Fleet(inv, first, bodies_served(FLEET))
    finally:
        FLEET.cli("down")


def _pids(hosts: list[str]) -> dict[str, str]:
    """The SGLang engine's main PID on each of ``hosts``."""
    st = FLEET.state()
    return {h: ssh(h, "systemctl show -p MainPID --value kimi-sglang", cluster_state=st) for h in hosts}


def _sglang() -> list[str]:
    return [h["name"] for h in FLEET.state()["hosts"][HOSTS - sglang_hosts(HOSTS) :]]


def test_the_first_converge_of_sixteen_hosts_serves_with_no_error_and_each_file_from_the_hub_once(
    fleet: Fleet,
) -> None:
    run = fleet.first
    assert run.code == 0, run.log[-4000:]
    assert run.errors() == {}
    # every instance answers from outside the cluster
    silent = [e.host for e in endpoints(FLEET, HOSTS) if not answers(FLEET, e)]
    assert silent == []
    lock = json.loads((ROOT / f"recipes/locks/moonshotai--Kimi-K3.1-Pro-Tiny@{REVISION}.json").read_text())
    assert sorted(fleet.served) == sorted(lock["files"])  # every file of the revision ...
    assert set(fleet.served.values()) == {1}, {path: n for path, n in fleet.served.items() if n > 1}  # ... once
    # one line per step rather than one per host and step
    assert "--> kimi | Releases (engine, host tools): " in run.log
    assert "] No changes" not in run.log
    assert "] Success" not in run.log


def test_a_converged_fleet_takes_no_step_and_restarts_nothing(fleet: Fleet) -> None:
    pids = _pids(_sglang())
    run = FLEET.pyinfra(fleet.inventory)
    assert run.code == 0, run.log[-3000:]
    assert run.payload is not None
    assert run.payload["results"]["operations"] == []  # not one operation on any host
    assert f"--> {HOSTS} hosts: {HOSTS} converged (no step to take), 0 with steps to take" in run.log
    assert _pids(_sglang()) == pids


@pytest.fixture
def blocked(fleet: Fleet) -> Iterator[tuple[str, str, int]]:
    """The first SGLang host drops what the second sends to its dist-init port (29500)."""
    first, second = _sglang()[:2]
    st = FLEET.state()
    address = next(h["address"] for h in st["hosts"] if h["name"] == second)
    ssh(
        first,
        "nft add table inet kimitest && nft add chain inet kimitest input "
        f"'{{ type filter hook input priority 0; }}' && nft add rule inet kimitest input ip saddr {address} "
        "tcp dport 29500 drop",
        cluster_state=st,
    )
    try:
        yield first, second, 29500
    finally:
        ssh(first, "nft delete table inet kimitest", cluster_state=st)


def _restarting(fleet: Fleet) -> Path:
    recipe = fleet.inventory.with_name(f"fleet-{HOSTS}.yaml")
    data: dict[str, Any] = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["topologies"]["demo-sglang"]["env"] = {"KIMI_DEMO_GENERATION": "restart"}
    path = fleet.inventory.with_name("restarting.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_a_port_blocked_between_two_of_the_sixteen_is_named_on_every_host_of_the_check(
    fleet: Fleet, blocked: tuple[str, str, int]
) -> None:
    first, second, port = blocked
    topology = _sglang()
    pids = _pids(topology)
    run = FLEET.pyinfra(fleet.inventory, "--data", f"kimi_recipe={_restarting(fleet)}")
    assert run.code != 0
    assert sorted(run.errors()["Communication check"]) == sorted(topology)
    lines = {h: found[0] for h, found in host_lines(run.log, "kimi-deploy: comm check: ", topology).items() if found}
    assert lines == dict.fromkeys(topology, f"{second} -> {first}:{port} (kimi-sglang dist_init): timed out")
    assert _pids(topology) == pids
