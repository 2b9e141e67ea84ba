"""Restarts in batches, so that part of a topology keeps serving while the rest restarts.

Pure: from the plan. A pool with several independent instances restarts its even instances
first and its odd ones only once the first half answers its smoke tests; an instance spanning
hosts moves as one. A pool of one instance has nothing to keep serving and goes in the first
batch. Routers go in a last batch of their own, once every engine of both batches answers: the
real vllm-router serves as soon as one of its engines is healthy, and started beside an engine
still loading it answered requests with 500 (vllm-router 0.1.17 before two real vLLM instances),
so it (re)starts, and is smoke tested, only after all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_deploy.servespec import HostPlan

BATCHES = 3
ROUTERS = 2


def batch_of(host: HostPlan, topology: Sequence[HostPlan]) -> int:
    """The batch (0 first, then 1, then the routers' 2) in which ``host``'s units (re)start."""
    if host.role == "router":
        return ROUTERS
    instances = {h.instance for h in topology if h.pool == host.pool}
    return host.instance % 2 if len(instances) > 1 else 0
