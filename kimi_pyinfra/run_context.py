"""What one pyinfra run knows beyond a single host: created once per run, reached one way.

pyinfra runs a deploy file once per host, each with fresh globals, concurrently (one greenlet per
host), and runs operations again when it executes them. Decisions that span hosts (the whole
inventory's plan, every host's probe, who fetches weights from whom, the lock a host resolves for
the others) and what must be the same on every host (the run's id, the weights transfer key) live
here, on pyinfra's ``State`` of the run: a new run, in the same process or not, starts empty.
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from gevent.event import Event  # type: ignore[import-untyped]
from pyinfra.context import ctx_state

from kimi_deploy.converge.cold_start import HostColdStart
from kimi_deploy.converge.compile_caches import CompileCacheStep
from kimi_deploy.converge.plan import Converge
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.weights.fanout import FanOutPart
from kimi_pyinfra.all_at_once import aligned, widen_pools

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Probe:
    """One fact read on every host of the run at once: set once every host has answered."""

    done: Any = field(default_factory=Event)
    # host name -> the fact, or the exception its probe raised
    results: dict[str, Any] = field(default_factory=dict)


@dataclass
class Once:
    """One value read for many hosts that ask at once: set once the first asker has read it."""

    done: Any = field(default_factory=Event)
    value: Any = None


@dataclass
class RunContext:
    # When the run started (UTC) and a random part: release log entries carry it, so a rollback
    # knows which hosts the latest converge switched; the communication check trusts only
    # listeners of its own run. Ids sort by start time.
    run_id: str
    # The key of this run's weights transfers between hosts, worth nothing once its peer servers stop.
    transfer_key: str
    # The controller's environment as the run found it: the secrets the recipe names by variable.
    environ: Mapping[str, str]
    # The communication check's token, shared by the run's hosts: it proves a listener, a report
    # or a probe's findings are the run's own (the run id above is public).
    comm_check_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    # (recipe file, inventory label) -> the whole inventory's plan, planned once per run and recipe
    plans: dict[tuple[str, str], tuple[Recipe, Inventory, Plan]] = field(default_factory=dict)
    # (recipe file, topology) -> why its engine release cannot load its checkpoints, None: it can
    # (``kimi_deploy.releases.servability``: each lock read once per run, not once per host)
    refused: dict[tuple[str, str], ConfigError | None] = field(default_factory=dict)
    # host name -> its part of the plan and its converge
    todos: dict[str, tuple[DeployPlan, Converge]] = field(default_factory=dict)
    # each checkpoint slot's fan-out (``converge_steps.plan_fan_outs``): the model's, then the drafts'
    fan_out: list[dict[str, FanOutPart]] | None = None
    # each host's compile cache steps, decided once for the run (``kimi_deploy.converge.compile_caches``)
    compile_caches: dict[str, list[CompileCacheStep]] | None = None
    # (recipe file, topology) -> the hosts of it this run covers, their converges, and what their
    # views share (``kimi_pyinfra.converge_run.view_of``, ``converge.steps.RunView.shared``)
    topologies: dict[tuple[str, str], tuple[list[HostPlan], dict[str, tuple[DeployPlan, Converge]], dict[str, Any]]] = (
        field(default_factory=dict)
    )
    # artifact name (``<unit>-<key>``) -> the manifest a host packed in this run and the controller
    # holds, once its pack is done: what the hosts of later batches receive (``operations.compile_cache``)
    compile_caches_packed: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    # fact name -> every host's answer (``kimi_pyinfra.probe``)
    probes: dict[str, Probe] = field(default_factory=dict)
    # a release's lock for one platform (``kimi_deploy.releases.lock``: requirements, without,
    # index, platform) -> its text, or the ``LockError`` resolving it raised: made once for all
    # hosts that install it
    locks: dict[tuple[Any, ...], Once] = field(default_factory=dict)
    # (host, path) of damaged releases already reported
    damage_said: set[tuple[str, str]] = field(default_factory=set)
    # host name -> whether its rehearsal found a step to take (``kimi_pyinfra.rehearsal``)
    rehearsed: dict[str, bool] = field(default_factory=dict)
    # whether this run prints step lines (``kimi_pyinfra.fleet_progress``)
    step_lines: bool = False
    # (host name, operation hash) -> the file the host program of that operation keeps its progress
    # in while it runs (``kimi_pyinfra.progress_reads``); an operation's entries go when it ends
    progress_files: dict[tuple[str, str], str] = field(default_factory=dict)
    # host name -> how long each phase of its converge took, for each host that took a step, once
    # the run ended (``kimi_pyinfra.cold_start``): what a release record could keep of it
    cold_start: dict[str, HostColdStart] = field(default_factory=dict)
    # host name -> its hardware profile (deploys/report.py)
    profiles: dict[str, HostProfile] = field(default_factory=dict)
    # deploys/ladder.py: each host's context ladder proofs, read so far
    ladders: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # deploys/status.py: whether the status table was printed (once, by the first host past the probe)
    status_shown: bool = False


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def run_context() -> RunContext:
    """This run's context, created by the first caller of the run. Greenlets switch only on I/O,
    so the check and the creation happen as one step."""
    state = ctx_state.get()  # type: ignore[no-untyped-call]  # the run's State, not a proxy
    context: RunContext | None = getattr(state, "kimi_run", None)
    if context is None:
        context = RunContext(new_run_id(), secrets.token_urlsafe(32), dict(os.environ))
        state.kimi_run = context
        widen_pools(state)
    aligned(state)
    return context


def in_run(deploy: Callable[P, R]) -> Callable[P, R]:
    """A deploy (``@pyinfra_deploy``) called with this run's context in place: pyinfra reads a
    deploy's arguments (``_parallel`` among them, the run's ``PARALLEL``) as the deploy is called,
    so the pools are widened first (``kimi_pyinfra.all_at_once``), or the first host's deploy and
    the others' disagree past 40 hosts ("Cannot have different values for `_parallel`")."""

    @functools.wraps(deploy)
    def called(*args: P.args, **kwargs: P.kwargs) -> R:
        run_context()
        return deploy(*args, **kwargs)

    return called
