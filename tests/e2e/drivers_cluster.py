"""Hosts of one kind in a cluster of a test's own, for the drivers step alone: the demo recipe with
one topology over all of them, an inventory naming them, and ``deploys/drivers.py`` run on them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.own_cluster import OwnCluster, Run
from tests.e2e.demo import drivers_recipe, ssh


@dataclass(frozen=True)
class DriversHosts:
    """``hosts`` of ``hardware`` in ``cluster``, one TP=8 instance of topology ``drivers``."""

    cluster: OwnCluster
    hardware: str
    hosts: int
    accelerators: dict[str, Any]
    nvidia: dict[str, Any]

    @contextlib.contextmanager
    def fresh(self, folder: Path) -> Iterator[dict[str, Any]]:
        """Fresh hosts, their state with ``"inventory"``; down again at the end."""
        recipe = folder / "recipe.yaml"
        drivers_recipe(recipe, self.nvidia, "drivers", self.accelerators, hosts=self.hosts)
        with self.cluster.fresh(self.hardware, folder, hosts=self.hosts) as st:
            st["inventory"] = self.cluster.inventory(folder / "inventory.py", recipe, "drivers = _hosts")
            yield st

    def run(self, st: dict[str, Any], *args: str) -> Run:
        return self.cluster.pyinfra(st["inventory"], *args, deploy="deploys/drivers.py")


def channel(st: dict[str, Any], host: str) -> str:
    """IMEX channel 0's node as "c MAJOR:MINOR MODE" (or what stat says when it is not a character device)."""
    said = ssh(host, "stat -c '%t %T %a %F' /dev/nvidia-caps-imex-channels/channel0 2>&1 || true", cluster_state=st)
    major, minor, mode, kind = [*said.split(" ", 3), "", "", "", ""][:4]
    return f"c {int(major, 16)}:{int(minor, 16)} {mode}" if kind == "character special file" else said


def imex_major(st: dict[str, Any], host: str) -> int:
    """The major the nvidia module registered for IMEX channels, as the host's /proc/devices says."""
    return int(ssh(host, "awk '$2 == \"nvidia-caps-imex-channels\" { print $1 }' /proc/devices", cluster_state=st))
