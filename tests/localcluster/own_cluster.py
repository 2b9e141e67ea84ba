"""A cluster of a test module's own, beside the default one and any other: its own state directory
(a temporary one) and subnet, so tests that change hosts never touch a cluster someone else uses.

    @pytest.fixture(scope="module")
    def my_cluster(tmp_path_factory):
        with own_cluster(tmp_path_factory, "KIMI_MY_TEST_SUBNET", "10.213.15.0/24", "--hosts", "1") as c:
            yield c

Skipped where no cluster can run, or where the subnet's bridge exists already (the variable then
names another subnet).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from localcluster.state import Settings
from tests.localcluster.conftest import TIMINGS, Cluster, checked, cluster_cli, why_not_here


def _cli_timed(label: str, env: dict[str, str], *args: str) -> None:
    started = time.monotonic()
    checked(cluster_cli(*args, env=env))
    TIMINGS[f"{args[0]}, {label}"] = time.monotonic() - started


@contextlib.contextmanager
def own_cluster(
    tmp_path_factory: pytest.TempPathFactory, subnet_variable: str, default_subnet: str, *up_args: str
) -> Iterator[Cluster]:
    """``up`` with ``up_args`` on a fresh state directory and the subnet ``$subnet_variable`` names;
    ``down`` at the end, whatever happened."""
    why = why_not_here()
    if why is not None:
        pytest.skip(why)
    subnet = os.environ.get(subnet_variable, default_subnet)
    state_dir = tmp_path_factory.mktemp("own-cluster")
    env = dict(os.environ, KIMI_CLUSTER_DIR=str(state_dir), KIMI_CLUSTER_SUBNET=subnet)
    settings = Settings.from_env(env)
    probe = subprocess.run(["ip", "link", "show", "dev", settings.bridge], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip(f"{subnet} is in use (bridge {settings.bridge} exists): set {subnet_variable}")
    label = f"own cluster on {subnet}"
    _cli_timed(label, env, "up", *up_args)
    try:
        yield Cluster(settings, env)
    finally:
        _cli_timed(label, env, "down")
