"""Restarts in two batches, so that part of a topology keeps serving while the rest restarts.

Pure: from the plan. A pool with several independent instances restarts its even instances
first and its odd ones only once the first half answers its smoke tests; an instance spanning
hosts moves as one. A pool of one instance has nothing to keep serving and goes in the first
batch. Routers go in the second: a router answers only when every engine behind it does, so it
(re)starts, and is smoke tested, once all of them run.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_deploy.servespec import HostPlan


def batch_of(host: HostPlan, topology: Sequence[HostPlan]) -> int:
    """The batch (0 first, then 1) in which ``host``'s units (re)start."""
    if host.role == "router":
        return 1
    instances = {h.instance for h in topology if h.pool == host.pool}
    return host.instance % 2 if len(instances) > 1 else 0
