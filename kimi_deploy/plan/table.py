"""The human-readable plan: one block per topology, one row per host, then each unit's argv."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from kimi_deploy.host.drivers import host_kind_lines
from kimi_deploy.parsers.nccl_tests import format_bytes
from kimi_deploy.plan.servespec import HostPlan, Plan
from kimi_deploy.plan.start_batches import restart_line
from kimi_deploy.recipe import Recipe
from kimi_deploy.serving.allreduce import instance_of, ranks_on
from kimi_deploy.serving.commcheck import needs_check


def _ports(host: HostPlan) -> str:
    parts: list[str] = []
    for unit in host.units:
        for label, port in unit.every_port().items():
            parts.append(f"{label}={port}")
    return " ".join(parts) or "-"


def _ranks(host: HostPlan) -> str:
    if host.role == "router":
        return "-"
    if host.dp > 1:
        last = host.dp_start_rank + host.dp_local - 1
        return f"dp {host.dp_start_rank}-{last}/{host.dp}"
    return f"tp {host.tp}" + (f" ep {host.ep}" if host.ep > 1 else "")


def _checks(recipe: Recipe, hosts: Sequence[HostPlan]) -> str | None:
    """What gates an engine (re)start of the topology, in one line; None when nothing does."""
    topology = recipe.topologies[hosts[0].topology]
    parts = []
    comm = topology.comm_check
    if needs_check(hosts):
        sample = f" and {comm.ephemeral_ports} of each host's ephemeral range" if comm.ephemeral_ports else ""
        parts.append(f"communication check (every port between hosts{sample}, >= {comm.min_mbit_s:g} Mbit/s)")
    check = comm.all_reduce
    if check is not None:
        instances: dict[tuple[str, str, int], int] = {}
        for h in hosts:
            if h.role != "router":
                instances[instance_of(h)] = instances.get(instance_of(h), 0) + ranks_on(check, h)
        ranks = "/".join(str(n) for n in sorted(set(instances.values())))
        skip = "; one-rank instances skip it" if 1 in instances.values() else ""
        parts.append(
            f"all-reduce per instance ({check.backend}, {ranks} ranks{skip}), "
            f"busbw >= {check.min_busbw_gbs:g} GB/s at {format_bytes(check.max_bytes)}"
        )
    return "before start: " + "; then ".join(parts) if parts else None


def format_plan(plan: Plan, recipe: Recipe | None = None) -> str:
    lines: list[str] = []
    topologies = list(dict.fromkeys(h.topology for h in plan.hosts))
    for name in topologies:
        hosts = plan.topology(name)
        engines = sorted({f"{h.engine} {h.engine_version}" for h in hosts})
        lines.append(f"topology {name}: {len(hosts)} hosts, {', '.join(engines)}")
        header = ("HOST", "ADDRESS", "POOL", "ROLE", "INST", "RANK", "PARALLEL", "BIND", "PORTS")
        rows = [header]
        for h in hosts:
            # where clients reach the host: its gateway's address, else its API's
            front = sorted(h.units, key=lambda u: u.kind != "gateway")
            bind = next((u.bind for u in front if "api" in u.listens or "router" in u.listens), "-")
            rows.append(
                (
                    h.host,
                    h.address,
                    h.pool,
                    h.node_role,
                    str(h.instance),
                    f"{h.node_rank}/{h.nodes}",
                    _ranks(h),
                    bind,
                    _ports(h),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        checks = _checks(recipe, hosts) if recipe is not None else None
        if checks:
            lines.append(f"  {checks}")
        restarts = restart_line(hosts)
        if restarts:
            lines.append(f"  {restarts}")
        if recipe is not None:
            lines += [f"  {line}" for line in host_kind_lines(recipe, hosts)]
        lines.append("")
        for h in hosts:
            for unit in h.units:
                lines.append(f"  {h.host} {unit.name}: {shlex.join(unit.argv)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
