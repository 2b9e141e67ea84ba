"""The tests' local cluster: one of their own, never the user's demo cluster (/var/lib/kimi-cluster,
10.213.7.0/24). Its state directory and subnet go into the environment of every `kimi-deploy
cluster` and pyinfra run the tests start (inventories/demo.py reads KIMI_CLUSTER_DIR); the session
that starts it takes it down (tests/e2e/conftest.py, tests/localcluster/conftest.py)."""

from __future__ import annotations

import os

STATE_DIR = "/var/lib/kimi-cluster-e2e"
SUBNET = "10.213.17.0/24"


def use_tests_cluster() -> None:
    """Name the tests' cluster in this process's environment, unless a cluster is named already."""
    os.environ.setdefault("KIMI_CLUSTER_DIR", STATE_DIR)
    os.environ.setdefault("KIMI_CLUSTER_SUBNET", SUBNET)
