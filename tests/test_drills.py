"""The fault drills' commands (``kimi_deploy.drills``, run by ``deploys/drill.py``): what each
injects on a host, that the shard corruption is silent (size and mtime kept, bytes changed), and
one line for a drill a host cannot run. The drills under load are bench/drills.py's; the
watchdog meeting them on real hosts is tests/e2e/test_demo_watchdog.py's."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.converge import Converge
from kimi_deploy.drills import DrillError, Faults, drill_commands, shard_of
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from localcluster.fault_knobs import FAULT_KNOBS
from tests.host_converge import LOCK, host_converge, lock_stands_in


@pytest.fixture
def todo(recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch) -> Converge:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    return host_converge(recipe, prod, "gb300-p01")


def test_the_safe_drills_act_through_systemd_and_the_scrub(todo: Converge) -> None:
    assert drill_commands("engine-killed", todo, ["kimi-vllm"], {}) == ["systemctl kill --signal=SIGKILL kimi-vllm.service"]
    assert drill_commands("engine-stopped", todo, ["kimi-vllm"], {}) == ["systemctl stop kimi-vllm.service"]
    flip, scrub = drill_commands("shard-corrupted", todo, ["kimi-vllm"], {})
    assert shlex.split(flip)[-1] == shard_of(todo)
    assert shard_of(todo).endswith(".safetensors")
    assert scrub == "systemctl start --no-block kimi-weights-scrub.service"


def test_other_drills_come_from_the_inventory_and_clear_undoes_them_all(todo: Converge) -> None:
    faults: Faults = {"engine-garbage": {"inject": "touch /x", "clear": "rm -f /x"}, "link-cut": {"inject": "ip link set x down"}}
    assert drill_commands("engine-garbage", todo, ["kimi-vllm"], faults) == ["touch /x"]
    assert drill_commands("clear", todo, ["kimi-vllm"], faults) == ["rm -f /x", "systemctl start kimi-vllm.service"]
    with pytest.raises(DrillError, match=r"^kimi_drill: no drill 'host-down' on this host \(it has engine-killed, engine-stopped, "
                                         r"shard-corrupted, engine-garbage, link-cut, clear\)$"):  # fmt: skip
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
    assert sorted(FAULT_KNOBS) == ["accelerator-lost", "engine-garbage"]
    assert all(set(knob) == {"inject", "clear"} for knob in FAULT_KNOBS.values())
