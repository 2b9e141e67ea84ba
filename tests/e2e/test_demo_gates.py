"""Preflight gates on hosts with the wrong hardware, in a second demo cluster of their own.

kimi-h1 has 8 H200 where the recipe wants B300; kimi-h2 is a TPU 7x host; kimi-h3 has 8 B300 but
an 8 MiB weights disk and a topology that offloads to host RAM (HiCache) more than it has. Every
host stops at its first operation with its lines, and nothing on it changes. (The RDMA gate reads
the kernel's /sys/class/infiniband, which test hosts cannot fake: tests/test_preflight.py covers
it. The fabric manager and IMEX are the drivers step's to install and judge:
tests/e2e/test_demo_drivers.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.own_cluster import BIN, ROOT, Run
from tests.e2e.demo import gpu_recipe_data, ssh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

HW_DIR = Path("/var/lib/kimi-cluster-gates")
ENV = {"KIMI_CLUSTER_DIR": str(HW_DIR), "KIMI_CLUSTER_SUBNET": "10.213.9.0/24"}


def _cli(*args: str) -> None:
    subprocess.run(
        [str(BIN / "kimi-deploy"), "cluster", *args], cwd=ROOT, check=True, timeout=900, env={**os.environ, **ENV}
    )


@pytest.fixture(scope="module")
def gates_cluster() -> Iterator[dict[str, Any]]:
    _cli("up", "--hardware", "h200x8,tpu7x4,b300x8-smalldisk")
    try:
        yield json.loads((HW_DIR / "state.json").read_text(encoding="utf-8"))
    finally:
        _cli("down")


INVENTORY = """
import json
_state = json.load(open({state!r}))
_common = {{"ssh_user": "root", "ssh_key": _state["ssh_key"], "ssh_known_hosts_file": _state["known_hosts"],
           "ssh_strict_host_key_checking": "yes", "kimi_recipe": {recipe!r},
           "kimi_pip_index_url": _state["services"]["index"]["url"],
           "kimi_hf_endpoint": _state["services"]["hub"]["url"]}}
_hosts = [(h["name"], {{"ssh_hostname": h["address"], **_common}}) for h in _state["hosts"]]
demo_vllm = _hosts[:2]
demo_sglang = _hosts[2:3]
"""


def test_each_gate_stops_its_host_with_one_line(gates_cluster: dict[str, Any], tmp_path: Path) -> None:
    data = gpu_recipe_data()
    for topo in data["topologies"].values():
        topo["expose"]["api_key"] = {"file": str(HW_DIR / "api-key")}
    data["topologies"]["demo-sglang"]["pools"]["serve"].update(hosts=1, parallel={"tp": 8})
    data["topologies"]["demo-sglang"]["hicache"] = {"ratio": 2.0}
    recipe = tmp_path / "recipe.yaml"
    inventory = tmp_path / "gates.py"
    inventory.write_text(INVENTORY.format(state=str(HW_DIR / "state.json"), recipe=str(recipe)), encoding="utf-8")
    recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    hosts = ("kimi-h1", "kimi-h2", "kimi-h3")
    before = {h: ssh(h, "ls", "-A", "/opt", "/etc/systemd/system", cluster_state=gates_cluster) for h in hosts}

    proc = subprocess.run(
        [str(BIN / "pyinfra"), str(inventory), "deploys/kimi.py", "-y"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **ENV},
    )
    run = Run(proc.returncode, None, proc.stdout + proc.stderr)
    assert run.code != 0
    lines = [line.strip() for line in run.log.splitlines() if "kimi-deploy: preflight:" in line]
    by_host = {
        h: [line.split("kimi-deploy: preflight: ", 1)[1] for line in lines if line.startswith(f"[{h}]")] for h in hosts
    }
    assert by_host["kimi-h1"] == [
        "kimi-h1: accelerators: pool serve needs 8 x B300 with >= 260 GiB, found 8 x NVIDIA H200 (140 GiB)",
    ]
    assert by_host["kimi-h2"] == ["kimi-h2: accelerators: pool serve needs 8 x B300 with >= 260 GiB, found 0 x none"]
    disk, ram = by_host["kimi-h3"]
    assert disk == (
        "kimi-h3: disk: /srv/models (tmpfs) needs 12.5 MiB in all (weights and a rollback copy), found 8.0 MiB"
    )
    assert ram.startswith("kimi-h3: host RAM: HiCache ratio 2 needs 4160 GiB (90% of RAM at most), found ")
    assert "No hosts remaining" in run.log
    after = {h: ssh(h, "ls", "-A", "/opt", "/etc/systemd/system", cluster_state=gates_cluster) for h in before}
    assert after == before
