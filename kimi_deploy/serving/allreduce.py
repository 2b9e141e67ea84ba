"""The all-reduce check of an engine instance: who takes part, their ranks, each host's request.

Pure: from the plan. With ``comm_check.all_reduce`` in a topology, the hosts of each engine
instance run one all-reduce together (``hostside/allreduce.py``), with the engine release's torch,
before any engine of the instance (re)starts: the communicator the engine's tensor and expert
parallel ranks will use, over the same links (NVLink inside a host, the fabric between hosts).
NCCL takes one rank per accelerator; gloo one per host, so an instance on one host has nothing to
test with gloo. Rank 0 is the instance's leader, whose address and ``ports.all_reduce`` are the
rendezvous. A router host is no instance's member.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_deploy.hostside.requests import AllReduceRequest
from kimi_deploy.parsers.nccl_tests import NcclTestsRun, check_bus_bandwidth, format_bytes, lowest_bus_bandwidth
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import AllReduce, Recipe


def instance_of(host: HostPlan) -> tuple[str, str, int]:
    return (host.topology, host.pool, host.instance)


def members(me: HostPlan, hosts: Sequence[HostPlan]) -> list[HostPlan]:
    """The hosts of ``me``'s engine instance among ``hosts``, leader first."""
    if me.role == "router":
        return []
    group = [h for h in hosts if h.role != "router" and instance_of(h) == instance_of(me)]
    return sorted(group, key=lambda h: h.node_rank)


def ranks_on(check: AllReduce, host: HostPlan) -> int:
    return host.accelerators if check.backend == "nccl" else 1


def label(host: HostPlan) -> str:
    return f"{host.topology}/{host.pool}#{host.instance}"


def why_not(recipe: Recipe, me: HostPlan, hosts: Sequence[HostPlan]) -> str | None:
    """Why ``me`` takes part in no all-reduce this run, or None when it does."""
    check = recipe.topologies[me.topology].comm_check.all_reduce
    if check is None:
        return f"topology {me.topology} sets no comm_check.all_reduce"
    group = members(me, hosts)
    if not group:
        return f"{me.host} runs no engine of topology {me.topology}"
    if sum(ranks_on(check, h) for h in group) < 2:
        return f"instance {label(me)} has a single {check.backend} rank: nothing to reduce across"
    return None


def rendezvous_host(recipe: Recipe, host: HostPlan) -> bool:
    """Whether ``host`` holds the rendezvous of its instance's all-reduce (its peers reach it there)."""
    check = recipe.topologies[host.topology].comm_check.all_reduce
    return check is not None and host.role != "router" and host.node_rank == 0 and host.nodes > 1


def all_reduce_request(recipe: Recipe, me: HostPlan, hosts: Sequence[HostPlan], run: str) -> AllReduceRequest | None:
    """``me``'s request to ``hostside/allreduce.py``; ``hosts`` are the topology's hosts in the run.
    None when ``why_not`` says why."""
    check = recipe.topologies[me.topology].comm_check.all_reduce
    if check is None or why_not(recipe, me, hosts) is not None:
        return None
    topology = recipe.topologies[me.topology]
    group = members(me, hosts)
    return {
        "run": run,
        "label": label(me),
        "me": me.host,
        "address": me.address,
        "backend": check.backend,
        "rendezvous": {"address": group[0].address, "port": topology.ports.all_reduce},
        "hosts": [{"host": h.host, "address": h.address, "ranks": ranks_on(check, h)} for h in group],
        "min_bytes": check.min_bytes,
        "max_bytes": check.max_bytes,
        "warmup_iters": check.warmup_iters,
        "iters": check.iters,
        "deadline_s": check.deadline_s,
        "min_busbw_gbs": check.min_busbw_gbs,
        # the engine's own environment: its NCCL and Gloo interface, HCAs and the topology's settings
        "env": dict(next((u.env for u in me.units if u.kind == "engine"), topology.env)),
    }


def nccl_verdict(recipe: Recipe, me: HostPlan, run: NcclTestsRun) -> tuple[str, str | None]:
    """The floor of ``me``'s topology's all-reduce check (``comm_check.all_reduce``) on an
    nccl-tests run captured there (``kimi-deploy facts check``): what passed, or the failure line,
    nccl-tests' own problems first, then the bus bandwidth at the largest size (the lower of
    out-of-place and in-place), as :func:`~kimi_deploy.parsers.nccl_tests.check_bus_bandwidth` says."""
    check = recipe.topologies[me.topology].comm_check.all_reduce
    if check is None:
        return f"all-reduce: topology {me.topology} sets no comm_check.all_reduce: nothing asked", None
    floor = check.min_busbw_gbs
    failure = check_bus_bandwidth(run, floor)
    if failure is not None:
        return "", f"all-reduce: {failure}"
    largest = max(row["size_bytes"] for row in run["rows"])
    busbw, _, _ = lowest_bus_bandwidth([row for row in run["rows"] if row["size_bytes"] == largest])
    size = format_bytes(largest)
    return f"all-reduce: {busbw:g} GB/s at {size} over {len(run['ranks'])} ranks, needs >= {floor:g} GB/s", None
