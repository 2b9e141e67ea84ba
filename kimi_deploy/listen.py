"""Where an engine's HTTP API listens and which port it uses."""

from __future__ import annotations

from kimi_deploy.inventory import InventoryHost
from kimi_deploy.recipe import Topology

# The engines' own default API ports: a recipe that sets none gets what the engine's docs say.
DEFAULT_API_PORT = {"vllm": 8000, "sglang": 30000, "tokenspeed": 8000}

LOOPBACK = "127.0.0.1"


def api_port(topology: Topology) -> int:
    ports = topology.ports
    return ports.api if ports.api is not None else DEFAULT_API_PORT[topology.engine]


def bind_address(topology: Topology, host: InventoryHost) -> str:
    """Loopback unless the recipe exposes the API (then an API key is configured)."""
    expose = topology.expose
    if expose is None:
        return LOOPBACK
    return host.address if expose.bind == "address" else expose.bind
