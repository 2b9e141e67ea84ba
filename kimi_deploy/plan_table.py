"""The human-readable plan: one block per topology, one row per host, then each unit's argv."""

from __future__ import annotations

import shlex

from kimi_deploy.servespec import HostPlan, Plan


def _ports(host: HostPlan) -> str:
    parts: list[str] = []
    for unit in host.units:
        for label, port in unit.listens.items():
            parts.append(f"{label}={port}")
    return " ".join(parts) or "-"


def _ranks(host: HostPlan) -> str:
    if host.role == "router":
        return "-"
    if host.dp > 1:
        last = host.dp_start_rank + host.dp_local - 1
        return f"dp {host.dp_start_rank}-{last}/{host.dp}"
    return f"tp {host.tp}" + (f" ep {host.ep}" if host.ep > 1 else "")


def format_plan(plan: Plan) -> str:
    lines: list[str] = []
    topologies = list(dict.fromkeys(h.topology for h in plan.hosts))
    for name in topologies:
        hosts = plan.topology(name)
        engines = sorted({f"{h.engine} {h.engine_version}" for h in hosts})
        lines.append(f"topology {name}: {len(hosts)} hosts, {', '.join(engines)}")
        header = ("HOST", "ADDRESS", "POOL", "ROLE", "INST", "RANK", "PARALLEL", "BIND", "PORTS")
        rows = [header]
        for h in hosts:
            bind = next((u.bind for u in h.units if "api" in u.listens or "router" in u.listens), "-")
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
        lines.append("")
        for h in hosts:
            for unit in h.units:
                lines.append(f"  {h.host} {unit.name}: {shlex.join(unit.argv)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
