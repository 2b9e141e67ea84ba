"""Where an engine's HTTP API listens, and where its topology's clients reach it.

An engine's own key check is no boundary (``kimi_deploy.render.engine_guard``), so an engine never takes
clients' connections itself: behind a router it answers that router's host alone, and an exposed
topology without a router puts a gateway of its own in front of each instance
(``kimi_deploy.render.gateway.engine_gateway_unit``): nginx takes the topology's API port on the exposed
address and checks the key, and the engine listens on loopback at ``ports.api_backend``.
"""

from __future__ import annotations

from kimi_deploy.inventory import InventoryHost
from kimi_deploy.recipe import Topology

LOOPBACK = "127.0.0.1"


def gatewayed(topology: Topology) -> bool:
    """Whether the topology's engines serve behind gateways of their own (exposed, no router)."""
    return topology.expose is not None and topology.router is None


def client_address(topology: Topology, host: InventoryHost) -> str:
    """Where the topology's clients (or its router) reach ``host``: loopback unless the recipe
    exposes the API (then an API key is configured)."""
    expose = topology.expose
    if expose is None:
        return LOOPBACK
    return host.address if expose.bind == "address" else expose.bind


def bind_address(topology: Topology, host: InventoryHost) -> str:
    """Where an engine of ``topology`` on ``host`` binds its API: where its router reaches it, or
    loopback (unexposed, or behind its own gateway)."""
    return LOOPBACK if gatewayed(topology) else client_address(topology, host)
