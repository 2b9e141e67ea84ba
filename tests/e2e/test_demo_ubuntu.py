"""The drivers step on two GB300-like trays running Ubuntu 24.04, in a cluster of their own.

Their OS is Ubuntu's own (the base image is made from Ubuntu's archive), so the drivers step reads
``ubuntu2404`` in NVIDIA's repository and installs Ubuntu's names there: ``libnvidia-compute-580``
and ``nvidia-dkms-580-open`` at ``580.95.05-1ubuntu1``, with IMEX (one TP=8 instance over both trays)
and no fabric manager. A re-run runs no command. (The trays' CPUs stay x86_64: the sbsa trees are
planned from the probe's architecture, not executed here.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from harness.own_cluster import OwnCluster
from tests.e2e.demo import ssh
from tests.e2e.drivers_cluster import DriversHosts, channel, imex_major

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

HOSTS = ("kimi-h1", "kimi-h2")
DRIVER = "580.95.05"
UBUNTU_NAMES = ("libnvidia-compute-580", "nvidia-dkms-580-open", "nvidia-imex")


UBUNTU = DriversHosts(
    OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-ubuntu", "KIMI_CLUSTER_SUBNET": "10.213.19.0/24"}),
    "gb300x4-ubuntu24.04",
    2,
    {"model": "GB300", "per_host": 4, "memory_gib": 260},
    {"branch": "580", "version": DRIVER},
)


@pytest.fixture(scope="module")
def trays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with UBUNTU.fresh(tmp_path_factory.mktemp("ubuntu")) as st:
        yield st


def sh(st: dict[str, Any], host: str, command: str) -> str:
    return ssh(host, command, cluster_state=st)


def packages(st: dict[str, Any], host: str) -> dict[str, str]:
    """Installed NVIDIA packages, Ubuntu's names included: name -> "version status"."""
    out = sh(st, host, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-*' 'libnvidia-*'")
    return {w[0]: f"{w[1]} {w[2]}" for w in (line.split() for line in out.splitlines()) if len(w) == 3}


def test_ubuntu_trays_get_ubuntus_packages_and_imex(trays: dict[str, Any]) -> None:
    st = trays
    run = UBUNTU.run(st)
    assert run.code == 0, run.log[-4000:]
    tree = f"{st['services']['apt']['url'].rstrip('/')}/ubuntu2404/x86_64/"
    for host in HOSTS:
        assert sh(st, host, ". /etc/os-release && echo $ID $VERSION_ID") == "ubuntu 24.04"
        found = packages(st, host)
        assert {p: found[p] for p in UBUNTU_NAMES} == dict.fromkeys(UBUNTU_NAMES, f"{DRIVER}-1ubuntu1 hi")
        assert found[f"nvidia-driver-pinning-{DRIVER}"] == f"{DRIVER}-1ubuntu1 ii"
        assert not any(
            p.startswith(("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-fabricmanager")) for p in found
        )
        assert tree in sh(st, host, "cat /etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list")
        assert sh(st, host, "systemctl is-active nvidia-imex") == "active"
        assert channel(st, host) == f"c {imex_major(st, host)}:0 666"
        assert sh(st, host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u") == DRIVER
    again = UBUNTU.run(st)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
