"""The drivers step on an HGX B300 board of a cluster of its own: the fabric manager with the NVLink
subnet manager it needs.

B300 is NVLink 5: its fabric manager's start script starts only with ``nvlsm``, ``ibstat``
(infiniband-diags) and the ``ib_umad`` module (the cluster's stand-in behaves so, citing NVIDIA's
driver container). The drivers step installs both packages with the driver set, lists the module in
``/etc/modules-load.d`` for every boot and loads it before the fabric manager starts; a re-run runs
no command; with nvlsm taken away the fabric manager cannot start again, and the next converge puts
it back and restarts the fabric manager. (That a reboot loads the module again, from modules-load.d,
is tests/localcluster/test_nvidia_live.py's.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from harness.own_cluster import OwnCluster
from tests.e2e.demo import ssh
from tests.e2e.drivers_cluster import DriversHosts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

HOST = "kimi-h1"
DRIVER = "580.95.05"
MISSING = "NVLink subnet manager cannot start: missing nvlsm (no /opt/nvidia/nvlsm/sbin/nvlsm)"


NVLSM = DriversHosts(
    OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-nvlsm", "KIMI_CLUSTER_SUBNET": "10.213.18.0/24"}),
    "b300x8",
    1,
    {"model": "B300", "per_host": 8, "memory_gib": 260},
    {"branch": "580", "version": DRIVER},
)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with NVLSM.fresh(tmp_path_factory.mktemp("nvlsm")) as st:
        yield st


def sh(st: dict[str, Any], command: str) -> str:
    return ssh(HOST, command, cluster_state=st)


def installed(st: dict[str, Any]) -> dict[str, str]:
    out = sh(st, "dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' nvlsm infiniband-diags 2>/dev/null || true")
    return {w[0]: w[1] for w in (line.split() for line in out.splitlines()) if len(w) == 2}


@pytest.fixture(scope="module")
def converged(board: dict[str, Any]) -> dict[str, Any]:
    run = NVLSM.run(board)
    assert run.code == 0, run.log[-4000:]
    return board


def test_the_fabric_manager_runs_with_the_subnet_manager_and_its_module(converged: dict[str, Any]) -> None:
    st = converged
    assert installed(st) == {"nvlsm": "ii", "infiniband-diags": "ii"}  # installed, not held: not the driver's
    assert sh(st, "grep -v '^#' /etc/modules-load.d/nvidia-nvlsm.conf") == "ib_umad"
    assert sh(st, "test -e /run/kimi-standin-modules/ib_umad && echo loaded") == "loaded"
    assert sh(st, "systemctl is-active nvidia-fabricmanager") == "active"
    assert "Detected NVL5 system" in sh(st, "journalctl -u nvidia-fabricmanager -o cat --no-pager")
    again = NVLSM.run(st)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}


def test_without_nvlsm_the_fabric_manager_stops_and_the_converge_puts_it_back(converged: dict[str, Any]) -> None:
    st = converged
    sh(st, "DEBIAN_FRONTEND=noninteractive apt-get -q -y remove nvlsm >/dev/null")
    cursor = sh(st, "journalctl -u nvidia-fabricmanager -n 0 --show-cursor -o cat --no-pager").split("cursor: ")[-1]
    assert sh(st, "systemctl restart nvidia-fabricmanager && echo started || echo failed") == "failed"
    said = sh(st, f"journalctl -u nvidia-fabricmanager --after-cursor '{cursor}' -o cat --no-pager")
    assert MISSING in said
    run = NVLSM.run(st)
    assert run.code == 0, run.log[-3000:]
    changed = run.changed()
    assert changed.pop("NVIDIA driver packages") == [HOST]
    assert changed.pop("NVIDIA services") == [HOST]  # restarted after ib_umad is loaded
    assert set(changed) <= {"NVIDIA repository"}  # apt reads the repository before installing
    assert installed(st)["nvlsm"] == "ii"
    assert sh(st, "systemctl is-active nvidia-fabricmanager") == "active"
    assert NVLSM.run(st).changed() == {}
