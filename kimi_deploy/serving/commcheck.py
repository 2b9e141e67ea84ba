"""The communication check of a multi-host topology: which hosts take part and what each tests.

Pure: from the plan. A topology needs the check when its hosts talk to each other (an instance
spanning hosts, prefill/decode pools, a router). Every host of it listens on the ports its peers
will reach (each unit's ports on the host's address; an API bound to loopback is nobody else's
business) and reaches every port every other host listens on (an engine's guarded API port only
from the hosts it admits), plus the check's own port, where a bounded bandwidth test also runs,
and ``comm_check.ephemeral_ports`` ports of each host's ephemeral range, where NCCL, Gloo, UCX
and the engines listen on ports no plan can name. The hosts run ``hostside/commcheck.py`` at the
same time and exchange results, so a failure anywhere fails every host of the topology.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_deploy.hostside.requests import CommCheckRequest, ProbePort
from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.engine_guard import admitted
from kimi_deploy.serving.allreduce import rendezvous_host


def needs_check(hosts: Sequence[HostPlan]) -> bool:
    """Whether the hosts of one topology communicate with each other."""
    return len(hosts) > 1 and any(h.nodes > 1 or h.role != "serve" for h in hosts)


def reachable_ports(host: HostPlan, by: str | None = None) -> list[ProbePort]:
    """The ports other hosts reach on ``host`` (once its units run), labelled for the report; with
    ``by``, those the host at that address may reach (an engine's guarded API admits its router's)."""
    ports: dict[int, str] = {}
    for unit in host.units:
        for label, port in sorted(unit.listens.items()):
            if label in ("api", "router_backend") and unit.bind == LOOPBACK:
                continue
            if label == "api" and by is not None and not admitted(unit, by):
                continue
            ports.setdefault(port, f"{unit.name} {label}")
    return [{"port": port, "label": label} for port, label in sorted(ports.items())]


def checked_ports(recipe: Recipe, host: HostPlan, by: str | None = None) -> list[ProbePort]:
    """``reachable_ports`` and, on an instance leader, the all-reduce check's rendezvous port."""
    ports = reachable_ports(host, by)
    if rendezvous_host(recipe, host):
        port = recipe.topologies[host.topology].ports.all_reduce
        if all(p["port"] != port for p in ports):
            ports = sorted([*ports, {"port": port, "label": "all-reduce rendezvous"}], key=lambda p: p["port"])
    return ports


def check_request(recipe: Recipe, me: HostPlan, hosts: Sequence[HostPlan], run: str) -> CommCheckRequest:
    """``me``'s request to ``hostside/commcheck.py``; ``hosts`` are every host of its topology."""
    topology = recipe.topologies[me.topology]
    check = topology.comm_check
    return {
        "run": run,
        "me": me.host,
        "address": me.address,
        "port": topology.ports.comm_check,
        "listen": checked_ports(recipe, me),
        "peers": [
            {"host": h.host, "address": h.address, "ports": checked_ports(recipe, h, me.address)}
            for h in hosts
            if h.host != me.host
        ],
        "bandwidth": {"bytes": check.bytes, "min_mbit_s": check.min_mbit_s, "max_s": check.max_s},
        "deadline_s": check.deadline_s,
        "ephemeral": check.ephemeral_ports,
    }
