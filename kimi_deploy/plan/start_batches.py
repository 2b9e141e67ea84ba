"""Restarts in batches, so that part of a topology keeps serving while the rest restarts.

Pure: from the plan and, in a converge, what the probes found. A pool with several independent
instances restarts its even instances first and its odd ones only once the first half answers its
smoke tests; an instance spanning hosts moves as one. An instance that does not serve (an engine
of it stopped, failed or not yet started, or a host of it that did not answer the probe) has
nothing to keep: it goes in the first batch, and of those that serve, every other one from the
second on joins it, so that one of them at least keeps serving until the first batch answers. A
pool of one instance, or none that serves, has nothing to keep serving and goes in the first
batch. Routers go in a last batch of their own, once every engine of both batches answers: the
real vllm-router serves as soon as one of its engines is healthy, and started beside an engine
still loading it answered requests with 500 (vllm-router 0.1.17 before two real vLLM instances),
so it (re)starts, and is smoke tested, only after all of them. A store (the Mooncake master, on
the router host) is the exception: the engines connect to it as they start, so it (re)starts in
the first batch, and its host's release is put in place then.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from kimi_deploy.plan.servespec import HostPlan

BATCHES = 3
ROUTERS = 2
STORES = 0  # kimi_deploy.plan.servespec.Unit.stage of a topology's stores
ENGINES = (1, 2)  # the stages of engine leaders and workers


def batch_of(host: HostPlan, topology: Sequence[HostPlan], down: Collection[tuple[str, int]] = ()) -> int:
    """The batch (0 first, then 1, then the routers' 2) in which ``host``'s units (re)start.

    + down: the instances, ``(pool, instance)``, that do not serve now (none: the plan's order)
    """
    if host.role == "router":
        return ROUTERS
    instances = _instances(topology, host.pool)
    if len(instances) < 2:
        return 0
    if not down:
        return host.instance % 2
    if (host.pool, host.instance) in down:
        return 0
    serving = [i for i in instances if (host.pool, i) not in down]
    return 0 if serving.index(host.instance) % 2 else 1


def _instances(topology: Sequence[HostPlan], pool: str) -> list[int]:
    """The instances of ``pool`` in ``topology``, in order."""
    return sorted({h.instance for h in topology if h.pool == pool})


def only_instance(host: HostPlan, topology: Sequence[HostPlan]) -> str | None:
    """``TOPOLOGY/POOL`` when ``host`` serves in a pool of a single instance, whose restart leaves
    the pool without service until it answers again; None otherwise (a router, or several)."""
    if host.role == "router" or len(_instances(topology, host.pool)) > 1:
        return None
    return f"{host.topology}/{host.pool}"


def restart_line(topology: Sequence[HostPlan]) -> str | None:
    """How a restarting change moves ``topology``'s pools, in one line of the plan."""
    parts = []
    for pool in dict.fromkeys(h.pool for h in topology if h.role != "router"):
        instances = len(_instances(topology, pool))
        if instances > 1:
            parts.append(f"pool {pool}: {instances} instances in two batches, the second once the first answers")
        else:
            parts.append(f"pool {pool}: the only instance, without service until it answers again")
    return "restarts: " + "; ".join(parts) if parts else None


def unit_batch(stage: int, batch: int) -> int:
    """The batch a unit of ``stage`` (re)starts in on a host of ``batch``: a store in the first,
    every other unit in its host's."""
    return 0 if stage == STORES else batch


def first_batch(stages: Iterable[int], batch: int) -> int:
    """The batch a host of ``batch`` whose units have ``stages`` puts its release in place in:
    that of the first of its units to (re)start."""
    return min((unit_batch(stage, batch) for stage in stages), default=batch)


def first_batch_of(host: HostPlan, topology: Sequence[HostPlan], down: Collection[tuple[str, int]] = ()) -> int:
    return first_batch((u.stage for u in host.units), batch_of(host, topology, down))
