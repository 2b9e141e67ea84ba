"""Around each batch, the router's drain: the engines of a batch taken out of the router before
they restart, and put back once they answer their smoke tests (``hostside/router_drain.py`` on the
router host).

Pure: from the plan and what the run knows of each host. Only vllm-router routing over independent
instances drains (its ``/remove_worker`` and ``/add_worker``, read in vllm-router 0.1.17's source:
a removed engine gets no new request and the requests it was sent run to their end; its
prefill/decode router cannot add an engine back, and sglang-router's are not held to it here), only
a router already running (one the converge (re)starts comes after every batch), and only the
instances that restart in the batch. Without the drain, a request in flight on an engine that
stops is lost to its client (a stream cut; a whole answer retried by the router elsewhere only when
it was not streaming).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kimi_deploy.hostside.requests import DrainRequest
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.plan.start_batches import ROUTERS
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.router_units import worker_url
from kimi_deploy.serving.router_view import batch_workers

DRAINS = ("vllm-router",)


def drain_api(recipe: Recipe, spec: HostPlan, topology: Sequence[HostPlan]) -> str | None:
    """The API of the router on router host ``spec`` when it drains (``hostside/router_drain.py``'s
    ``api``; the host's probe then reads the engines a drain left out), else None."""
    topo = recipe.topologies[spec.topology]
    router = topo.router
    if spec.role != "router" or router is None or not router.drain_s or router.package not in DRAINS:
        return None
    if any(p.role in ("prefill", "decode") for p in topology):
        return None
    return f"http://127.0.0.1:{topo.ports.router_backend}"


def readmit_request(
    recipe: Recipe,
    spec: HostPlan,
    topology: Sequence[HostPlan],
    drained: Sequence[str],
    *,
    down: Collection[tuple[str, int]] = (),
) -> DrainRequest | None:
    """On router host ``spec``, whose probe found ``drained`` (the engines a drain took out of its
    router and did not put back: a converge that stopped in between), the drain's "in" request for
    those of them the router should send to. Those of instances that do not serve now (``down``)
    come back after their own batch. None: nothing to put back."""
    api = drain_api(recipe, spec, topology)
    if api is None or not drained:
        return None
    topo = recipe.topologies[spec.topology]
    assert topo.router is not None
    back = [
        worker_url(topo, p.address)
        for p in topology
        if p.role != "router"
        and p.node_rank == 0
        and (p.pool, p.instance) not in down
        and worker_url(topo, p.address) in drained
    ]
    if not back:
        return None
    return {"router": topo.router.package, "api": api, "phase": "in", "workers": back, "timeout_s": topo.router.drain_s}


def drain_request(
    recipe: Recipe,
    spec: HostPlan,
    topology: Sequence[HostPlan],
    batch: int,
    *,
    restarting: Collection[str],
    running: bool,
    down: Collection[tuple[str, int]] = (),
) -> DrainRequest | None:
    """``hostside/router_drain.py``'s request (its ``phase`` "out"; "in" puts them back) on router
    host ``spec`` for ``batch``, or None: no drain there.

    + topology: every host of the topology, in plan order
    + restarting: the hosts of the topology where an engine (re)starts in this run, or that were
      not probed (``converge_steps.restarting_hosts``)
    + running: the router host's router is running now
    + down: the instances that do not serve now (``start_batches.batch_of``)
    """
    api = drain_api(recipe, spec, topology)
    topo = recipe.topologies[spec.topology]
    router = topo.router
    if api is None or router is None or not running or batch >= ROUTERS:
        return None
    workers = batch_workers(topo, topology, batch, restarting, down)
    if not workers:
        return None
    return {
        "router": router.package,
        "api": api,
        "phase": "out",
        "workers": workers,
        "timeout_s": router.drain_s,
    }
