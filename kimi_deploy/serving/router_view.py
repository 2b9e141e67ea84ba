"""Between batches, the router's view: the engines of a batch its router must send to again before
the next batch stops anything (``hostside/router_view.py`` waits for it on the router host).

Pure: from the plan and what the run knows of each host. Only a router already running (it serves
while the batches restart the engines) and only the instances that (re)start in the batch are
waited on; a router (re)started by this converge starts after every batch, once all its engines
answer, and has nothing to catch up on. A router running from before its metrics port was
rendered serves them at the routers' default, 127.0.0.1:29000 (measured of vllm-router 0.1.17),
the default of ``ports.router_metrics`` too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kimi_deploy.hostside.requests import RouterViewRequest
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.plan.start_batches import ROUTERS, batch_of
from kimi_deploy.recipe import Recipe, Topology
from kimi_deploy.render.router_units import CIRCUIT_GAUGES, HEALTH_GAUGES, worker_url

# Rounds of the router's own checks waited at most: enough for a slow /health, not for a router that
# cannot reach the engine (a refused or unreachable engine fails the converge before the next batch).
ROUNDS = 3
# A router running from before ``router.health`` was rendered checks every 60 s (the routers'
# default) and takes an engine back after two passed checks, up to about 125 s: never less.
LEGACY_READMIT_S = 150


def batch_workers(
    topo: Topology,
    topology: Sequence[HostPlan],
    batch: int,
    restarting: Collection[str],
    down: Collection[tuple[str, int]] = (),
) -> list[str]:
    """The URLs a router knows the instances by that (re)start in ``batch`` (an instance moves when
    one of its hosts is in ``restarting``), in plan order."""
    moving = {(p.pool, p.instance) for p in topology if p.host in restarting and p.role != "router"}
    return [
        worker_url(topo, p.address)
        for p in topology
        if p.role != "router"
        and p.node_rank == 0
        and (p.pool, p.instance) in moving
        and batch_of(p, topology, down) == batch
    ]


def view_request(
    recipe: Recipe,
    spec: HostPlan,
    topology: Sequence[HostPlan],
    batch: int,
    *,
    restarting: Collection[str],
    running: bool,
    down: Collection[tuple[str, int]] = (),
) -> RouterViewRequest | None:
    """``hostside/router_view.py``'s request on router host ``spec`` after ``batch``, or None.

    + topology: every host of the topology, in plan order
    + restarting: the hosts of the topology where an engine (re)starts in this run, or that were
      not probed (``converge_steps.restarting_hosts``)
    + running: the router host's router is running now
    + down: the instances that do not serve now (``start_batches.batch_of``)
    """
    topo = recipe.topologies[spec.topology]
    if spec.role != "router" or topo.router is None or not running or batch >= ROUTERS:
        return None
    workers = batch_workers(topo, topology, batch, restarting, down)
    if not workers:
        return None
    health = topo.router.health
    return {
        "router": topo.router.package,
        "metrics": f"http://127.0.0.1:{topo.ports.router_metrics}/metrics",
        "gauge": HEALTH_GAUGES[topo.router.package],
        "circuit": CIRCUIT_GAUGES[topo.router.package],
        "circuit_open_s": health.circuit_open_s,
        "workers": workers,
        "timeout_s": max(LEGACY_READMIT_S, ROUNDS * (health.successes * health.interval_s + health.timeout_s))
        + health.circuit_open_s,
    }
