"""What ``deploys/kimi.py`` reads of the whole run before it decides a host's steps: every host's
probe request, and the run as the pure step function sees it (``kimi_deploy.converge.steps``).

pyinfra runs the deploy file once per host; the first one to ask probes every host at once
(``kimi_pyinfra.inventory_probe``), and each host's view is built from those answers and the plans, the
same on every host, so all hosts agree on who fetches weights from whom and who resolves a lock.
"""

from __future__ import annotations

import os
from typing import Any, cast

from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import inventory

from kimi_deploy.compile_cache.pins import pins
from kimi_deploy.converge.compile_caches import plan_compile_caches
from kimi_deploy.converge.file_diff import diff_request
from kimi_deploy.converge.host_files import host_files
from kimi_deploy.converge.plan import Converge, converge_request
from kimi_deploy.converge.steps import RunView, down_instances, plan_fan_outs, restarts, run_view
from kimi_deploy.host.drivers import probe_request as drivers_request
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.plan.start_batches import batch_of
from kimi_pyinfra.host_plan import todo_for
from kimi_pyinfra.inventory_probe import active_hosts, probe_all
from kimi_pyinfra.run_context import run_context


def probe_request(h: Host) -> dict[str, Any]:
    """What ``h``'s probe reads: its converge's state, its hardware and its drivers; with pyinfra's
    ``--diff``, also what it holds of each file the converge would change (``diff_request``)."""
    plan, work = todo_for(inventory, h)
    request = converge_request(work)
    asked = [u.compile_cache for u in plan.spec.units if u.compile_cache is not None]
    if asked:
        request["compile_caches"] = [{"dir": c.source, "engine_dir": c.target} for c in asked]
    if h.state.config.DIFF:
        request["diff"] = diff_request(host_files(plan, work))
    return {
        "request": request,
        # what preflight decides on: the topology matrix is the report's (deploys/report.py)
        "hardware": {"weights_dir": plan.recipe.paths.models, "topology": False},
        "drivers": drivers_request(plan.recipe, plan.spec),
    }


def view_of(state: State, me: Host, deploy: DeployPlan) -> RunView:
    """``me``'s view of the run (every host's probe answered by now)."""
    probed = probe_all(state, probe_request)
    hosts = active_hosts(state)
    context = run_context()
    if context.fan_out is None:  # once per run, for every host
        answered = [h for h in hosts if h.name in probed]
        context.fan_out = plan_fan_outs([(*todo_for(inventory, h), probed[h.name]) for h in answered])
        context.compile_caches = plan_compile_caches(
            [(*todo_for(inventory, h), probed[h.name], _restarting(h, probed[h.name])) for h in answered],
            pins(os.environ),
            _start_batches(state, answered, probed),
        )
    in_topology, todos, shared = _topology(state, me, deploy)
    return run_view(
        me.name,
        todos,
        probed,
        in_topology=in_topology,
        shared=shared,
        fan_out=context.fan_out,
        run_id=context.run_id,
        transfer_key=context.transfer_key,
        compile_caches=context.compile_caches,
    )


def _topology(
    state: State, me: Host, deploy: DeployPlan
) -> tuple[list[HostPlan], dict[str, tuple[DeployPlan, Converge]], dict[str, Any]]:
    """The hosts of ``me``'s topology the run covers, their converges (``me``'s among them), and
    what the topology's views work out alike (``RunView.shared``): once per topology and run, not
    once per host of it."""
    context = run_context()
    topology = (deploy.recipe_file, deploy.spec.topology)
    if topology not in context.topologies:
        in_topology = _in_topology(state, deploy)
        context.topologies[topology] = (in_topology, _todos(me, in_topology), {})
    in_topology, todos, shared = context.topologies[topology]
    if me.name not in todos:
        todos = {**todos, me.name: todo_for(inventory, me)}
    return in_topology, todos, shared


def _in_topology(state: State, deploy: DeployPlan) -> list[HostPlan]:
    """The hosts of ``deploy``'s topology that this run covers (whether or not they answered)."""
    return [
        p for p in deploy.topology if (h := inventory.get_host(p.host, None)) is not None and state.is_host_in_limit(h)
    ]


def _todos(me: Host, in_topology: list[HostPlan]) -> dict[str, tuple[DeployPlan, Converge]]:
    """What a host's view reads: its own converge and those of its topology's hosts."""
    todos = {p.host: todo_for(inventory, inventory.get_host(p.host)) for p in in_topology}
    todos[me.name] = todo_for(inventory, me)
    return todos


def _start_batches(state: State, answered: list[Host], probed: dict[str, Any]) -> dict[str, int]:
    """The batch of the start order each host's engines (re)start in this run, as its steps make
    them (``kimi_deploy.converge.steps``: the instances of its topology that do not serve go first)."""
    out = {}
    for h in answered:
        deploy = todo_for(inventory, h)[0]
        # the topology's view, whose instances down are worked out once and shared with its hosts' steps
        in_topology, todos, shared = _topology(state, h, deploy)
        view = run_view(
            h.name, todos, probed, in_topology=in_topology, shared=shared, fan_out=(), run_id="", transfer_key=""
        )
        out[h.name] = batch_of(deploy.spec, deploy.topology, down_instances(view))
    return out


def _restarting(h: Host, probed: Any) -> frozenset[str]:
    """The units that (re)start on ``h`` this run, from its probe's answer (none without one)."""
    return restarts(todo_for(inventory, h)[1], cast(HostState, probed)) if isinstance(probed, dict) else frozenset()
