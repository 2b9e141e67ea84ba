"""The fault drills' commands (``kimi_deploy.converge.drills``, run by ``deploys/drill.py``): what each
injects on a host, that the shard corruption is silent (size and mtime kept, bytes changed), and
one line for a drill a host cannot run. The drills under load are bench/drills.py's; the
watchdog meeting them on real hosts is tests/e2e/test_demo_watchdog.py's."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.converge.drills import HEAL_ALL, DrillError, Faults, drill_commands, shard_of
from kimi_deploy.converge.plan import Converge
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from localcluster.fault_knobs import FAULT_KNOBS
from tests.host_converge import LOCK, host_converge, lock_stands_in

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


@pytest.fixture
def todo(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch) -> Converge:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    return host_converge(recipe, prod, "gb300-p01")


def test_the_safe_drills_act_through_systemd_and_the_scrub(todo: Converge) -> None:
    assert drill_commands("engine-killed", todo, ["kimi-vllm"], {}) == [
        "systemctl kill --signal=SIGKILL kimi-vllm.service"
    ]
    assert drill_commands("engine-stopped", todo, ["kimi-vllm"], {}) == ["systemctl stop kimi-vllm.service"]
    flip, scrub = drill_commands("shard-corrupted", todo, ["kimi-vllm"], {})
    assert shlex.split(flip)[-1] == shard_of(todo)
    assert shard_of(todo).endswith(".safetensors")
    assert scrub == "systemctl start --no-block kimi-weights-scrub.service"


def test_other_drills_come_from_the_inventory_and_clear_undoes_them_all(todo: Converge) -> None:
    faults: Faults = {"engine-garbage": {"inject": "touch /x", "clear": "rm -f /x"}}
    assert drill_commands("engine-garbage", todo, ["kimi-vllm"], faults) == ["touch /x"]
    assert drill_commands("clear", todo, ["kimi-vllm"], faults) == [
        "rm -f /x",
        *HEAL_ALL,
        "systemctl start kimi-vllm.service",
    ]
    with pytest.raises(
        DrillError,
        match=r"^kimi_drill: no drill 'host-down' on this host \(it has engine-killed, engine-stopped, "
        r"shard-corrupted, link-cut, engine-garbage, clear\)$",
    ):
        drill_commands("host-down", todo, ["kimi-vllm"], faults)
    with pytest.raises(DrillError, match=r"^engine-killed: this host runs no engine$"):
        drill_commands("engine-killed", todo, [], {})


def test_the_shard_corruption_changes_bytes_and_keeps_size_and_mtime(tmp_path: Path, todo: Converge) -> None:
    shard = tmp_path / "model-00001-of-00096.safetensors"
    shard.write_bytes(bytes(range(256)) * 40)
    os.utime(shard, ns=(1_700_000_000_000_000_000, 1_700_000_000_123_456_789))
    before = shard.read_bytes()
    flip = drill_commands("shard-corrupted", todo, ["kimi-vllm"], {})[0]
    subprocess.run([*shlex.split(flip)[:-1], str(shard)], check=True)
    after = shard.read_bytes()
    assert len(after) == len(before)
    assert shard.stat().st_mtime_ns == 1_700_000_000_123_456_789
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed == list(range(len(before) // 2, len(before) // 2 + 64))


def test_the_local_cluster_s_knobs_inject_and_clear_each_of_its_drills() -> None:
    assert sorted(FAULT_KNOBS) == [
        "accelerator-lost",
        "accelerator-xid",
        "engine-garbage",
        "fabric-refused",
        "host-down",
    ]
    # a state is cleared; an event (an Xid logged) has nothing to clear
    assert {name: sorted(knob) for name, knob in FAULT_KNOBS.items()} == {
        "accelerator-lost": ["clear", "inject"],
        "accelerator-xid": ["inject"],
        "engine-garbage": ["clear", "inject"],
        "fabric-refused": ["clear", "inject"],
        "host-down": ["inject"],  # host-down: booted again by cluster up
    }


def test_a_link_cut_names_its_peer_and_heals_by_itself(todo: Converge) -> None:
    with pytest.raises(DrillError, match=r"^link-cut: no peer named: --data kimi_drill_peer=HOST"):
        drill_commands("link-cut", todo, ["kimi-vllm"], {})
    stop, cut, heal = drill_commands("link-cut", todo, ["kimi-vllm"], {}, peer="10.0.0.7", for_s=90)
    assert stop == "systemctl stop kimi-drill-heal-10.0.0.7.timer 2>/dev/null || true"
    assert cut == "ip route replace blackhole 10.0.0.7/32 proto 77"
    assert heal == (
        "systemd-run --quiet --collect --unit=kimi-drill-heal-10.0.0.7 --on-active=90 "
        "ip route del blackhole 10.0.0.7/32 proto 77"
    )
    assert (
        drill_commands("link-cut", todo, [], {}, peer="fd00::7")[1]
        == "ip -6 route replace blackhole fd00::7/128 proto 77"
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None,
    reason="a network namespace of its own needs root, unshare and iproute2",
)
def test_the_cut_drops_what_is_sent_to_the_peer_and_clear_removes_the_drill_s_routes_alone(todo: Converge) -> None:
    """In a network namespace of its own, with iproute2: the cut route is a blackhole (the
    kernel routes nothing to the peer, and still to its neighbour), a route of someone else's
    stays, and ``clear``'s flush leaves no drill route and the peer routed again."""
    cut = drill_commands("link-cut", todo, [], {}, peer="10.9.0.7")[1]
    script = "; ".join(
        [
            "ip link set lo up",
            "ip route add 10.9.0.0/24 dev lo",
            "ip route add blackhole 10.8.0.0/24",
            "ip route get 10.9.0.7",
            "echo ---",
            cut,
            "ip route show type blackhole",
            "echo ---",
            "ip route get 10.9.0.7 2>&1",
            "ip route get 10.9.0.8",
            "echo ---",
            HEAL_ALL[0],
            HEAL_ALL[1],
            "ip route show type blackhole",
            "ip route get 10.9.0.7",
        ]
    )
    out = subprocess.run(["unshare", "-n", "sh", "-c", script], capture_output=True, text=True, check=True).stdout
    routed, made, sent, after = out.split("---\n")
    assert routed.startswith("10.9.0.7 dev lo")
    assert "blackhole 10.9.0.7 proto 77" in made
    assert sent.splitlines()[0] == "RTNETLINK answers: Invalid argument"
    assert sent.splitlines()[1].startswith("10.9.0.8 dev lo")
    assert after.split()[:3] == ["blackhole", "10.8.0.0/24", "10.9.0.7"]
