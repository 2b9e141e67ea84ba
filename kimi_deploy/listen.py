"""Where an engine's HTTP API listens (its port: ``kimi_deploy.engines.interface.Engine.api_port``)."""

from __future__ import annotations

from kimi_deploy.inventory import InventoryHost
from kimi_deploy.recipe import Topology

LOOPBACK = "127.0.0.1"


def bind_address(topology: Topology, host: InventoryHost) -> str:
    """Loopback unless the recipe exposes the API (then an API key is configured)."""
    expose = topology.expose
    if expose is None:
        return LOOPBACK
    return host.address if expose.bind == "address" else expose.bind
