"""SSH as root to a host of a local cluster, from the cluster's state (``kimi-deploy cluster status
--json``): its key, its known hosts checked strictly, never a prompt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def root_ssh(state: Mapping[str, Any], address: str, *options: str) -> list[str]:
    """``ssh`` to ``root@address`` with the cluster's key and known hosts; ``options`` (``-o
    ConnectTimeout=5``, ``-N -L ...``) go before the destination, a command after it."""
    return [
        "ssh",
        "-i",
        str(state["ssh_key"]),
        "-o",
        f"UserKnownHostsFile={state['known_hosts']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        *options,
        f"root@{address}",
    ]
