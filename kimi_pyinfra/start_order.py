"""The order units start in across a run: batches, then stages, then the smoke tests of a batch.

A plain function every deploy that starts units calls once per batch, on every host, whether or
not the host has units there: pyinfra orders operations by each host's own sequence, so a step
is a barrier across hosts only if every host takes it. Stages: stores, engine leaders, engine
workers, routers, then the engine hosts' watchdogs; a leader answers once its workers have
joined, and a router once its engines answer, so the smoke tests come after the last stage.
"""

from __future__ import annotations

from collections.abc import Callable

from pyinfra.context import host, state

from kimi_deploy.hostside.probe_types import UnitState
from kimi_deploy.hostside.requests import DrainRequest, LadderRequest, RouterViewRequest, SmokePlan
from kimi_deploy.plan.start_batches import ROUTERS
from kimi_pyinfra.operations import ladder, serving, units
from kimi_pyinfra.rehearsal import Do, perform

STAGES = ("stores", "leaders", "workers", "routers", "watchdogs")  # kimi_deploy.plan.servespec.Unit.stage
# The batches' names in operation names (kimi_deploy.plan.start_batches): the first, the second, the routers'.
SUFFIXES = ("", " (second batch)", " (last batch)")


def start_batch(
    batch: int,
    mine: list[tuple[int, str, str, UnitState | None]],
    checks: list[SmokePlan],
    go: Callable[[], bool] | None = None,
    do: Do = perform,
    *,
    climb: LadderRequest | None = None,
    router_view: RouterViewRequest | None = None,
    drain: DrainRequest | None = None,
) -> None:
    """Start this host's units of ``batch`` in stage order, then smoke test them.

    + batch: 0 for the first batch, 1 for the second, 2 for the routers'

    + mine: this host's units in this batch, ``(stage, unit, release, current)`` (empty for a host
      of the other batch: it still takes every step)
    + checks: the smoke checks of those units (``serving.verified``)
    + go: evaluated when the step runs; False skips it (an earlier batch failed somewhere)
    + do: how each step is taken (``kimi_pyinfra.rehearsal``: rehearsed, or made an operation)
    + climb: the context ladder its engine climbs in this batch (``operations.ladder.climbed``),
      started and checked rung by rung instead of with the other units (None: none)
    + router_view: on a router host, the engines of this batch its router must send to again
      before the next batch goes (``serving.routed``; None: none)
    + drain: on a router host, the engines of this batch its router stops sending to before they
      restart, and sends to again once they answer (``serving.drained``; None: none)
    """
    suffix = SUFFIXES[batch]
    if batch < ROUTERS:
        # A barrier: no engine of the batch stops before its router sends it no new request and
        # the requests in flight on it ended.
        do(serving.drained, name=f"Drained from the router{suffix}", request=drain, _if=go)
    for stage in host.loop(range(len(STAGES))):  # type: ignore[no-untyped-call]
        steps = [(unit, release, current) for s, unit, release, current in mine if s == stage]
        do(units.started, name=f"Services: {STAGES[stage]}{suffix}", units=steps, _if=go)
    if climb is not None:
        # Not a barrier (no other host waits on it): only a host that climbs takes this step.
        do(ladder.climbed, name=f"Context ladder{suffix}", request=climb, _if=go)
    do(serving.verified, name=f"Smoke test{suffix}", checks=checks, _if=go)
    if batch < ROUTERS:
        do(serving.readmitted, name=f"Back in the router{suffix}", request=drain, _if=go)
        # A barrier too: the next batch stops nothing before the router sends to this one.
        do(serving.routed, name=f"Router sends to them{suffix}", request=router_view, _if=go)


def unless_failed(hosts: tuple[str, ...]) -> Callable[[], bool]:
    """A step's condition, evaluated when it runs: none of ``hosts`` failed (an earlier batch
    that failed keeps the next one serving the release it runs)."""
    return lambda: not any(state.inventory.get_host(name, None) in state.failed_hosts for name in hosts)
