"""Where a topology's clients send requests, and a curl that asks it.

A topology's front door, as the plan has it: its gateways (the router host's, or the one in
front of each engine instance of an exposed topology without a router), else its router, else each
instance's engine API (on its single or leader host). A front bound to every address is reached at
its host's address; one bound to loopback only from its own host.

The curl reads the topology's API key where the recipe says (``expose.api_key``): a file or an
environment variable of the machine it runs on, read by the shell when it runs, so the key is never
in the command line, nor in what prints it (the demo's own curl, ``scripts/demo``, does the same).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.servespec import HostPlan, Unit
from kimi_deploy.recipe import SecretRef

# the kinds of unit that take clients' requests, the first found in a topology serving them
_FRONTS = ("gateway", "router", "engine")
_EVERY_ADDRESS = ("0.0.0.0", "::")  # noqa: S104 - what a unit may bind, read here, not bound


@dataclass(frozen=True)
class Endpoint:
    """One place a topology's clients reach its API: ``url`` (``http://ADDRESS:PORT``), served by
    ``unit`` on ``host``; ``loopback``: reached from that host alone."""

    topology: str
    host: str
    unit: str
    url: str
    loopback: bool


def _port(unit: Unit) -> int | None:
    return unit.listens.get("router", unit.listens.get("api"))


def _endpoint(plan: HostPlan, unit: Unit, port: int) -> Endpoint:
    address = plan.address if unit.bind in _EVERY_ADDRESS else unit.bind
    shown = f"[{address}]" if ":" in address else address
    loopback = address in (LOOPBACK, "::1")
    return Endpoint(plan.topology, plan.host, unit.name, f"http://{shown}:{port}", loopback)


def endpoints(topology: Sequence[HostPlan]) -> list[Endpoint]:
    """Every front door of one topology's hosts (``Plan.topology(name)``), in plan order: its
    gateways, else its routers, else its engines' APIs; empty when none of its units takes clients."""
    for kind in _FRONTS:
        found = [
            _endpoint(plan, unit, port)
            for plan in topology
            for unit in plan.units
            if unit.kind == kind and (port := _port(unit)) is not None
        ]
        if found:
            return found
    return []


def _key_header(key: SecretRef) -> str:
    """The curl option that sends the key as a header read from a file descriptor, the key read by
    the shell from where ``key`` says."""
    source = f'"$(cat {shlex.quote(key.file)})"' if key.file is not None else f'"${key.env}"'
    return f"-H @<(printf 'Authorization: Bearer %s\\n' {source})"


def curl(endpoint: Endpoint, served_name: str, prompt: str, key: SecretRef | None) -> str:
    """A bash command line (over several lines) that asks ``endpoint``'s chat completions API for
    ``served_name``'s answer to ``prompt``, with ``key`` (None: a topology that checks none)."""
    body = json.dumps({"model": served_name, "messages": [{"role": "user", "content": prompt}]})
    words = ["curl -sS"]
    if key is not None:
        words.append(_key_header(key))
    words += [
        "-H 'Content-Type: application/json'",
        f"-d {shlex.quote(body)}",
        shlex.quote(f"{endpoint.url}/v1/chat/completions"),
    ]
    return " \\\n    ".join(words)
