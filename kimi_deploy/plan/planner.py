"""The planner: recipe x inventory -> one exact serve spec per host. Pure: no I/O to hosts.

Every failure is a ``ConfigError`` raised before anything is changed anywhere: placement rules
(``placement``), each engine's layout rules, names the pinned engine release does not know
(its flag catalog), flags it would not accept, and ports that clash on a host.
"""

from __future__ import annotations

from collections.abc import Callable

from kimi_deploy.accelerators import NONE
from kimi_deploy.compile_cache.unit import with_compile_cache
from kimi_deploy.engines import engine
from kimi_deploy.engines.common import node_role
from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.placement import Placement, TopologyPlacement, place
from kimi_deploy.plan.servespec import CPU_ANY, HostPlan, Plan, Unit
from kimi_deploy.recipe import EngineName, Recipe, Topology
from kimi_deploy.releases.catalog import Catalog, CatalogMissing, engine_catalog
from kimi_deploy.releases.host_paths import engine_dir, model_dir, router_dir
from kimi_deploy.render.engine_guard import guarded
from kimi_deploy.render.gateway import engine_gateway_unit, gateway_unit
from kimi_deploy.render.router_units import mooncake_master_unit, router_unit
from kimi_deploy.render.safe_text import is_ip_address


def argv_positionals(name: EngineName, catalog: Catalog) -> int:
    """Arguments before the first flag of engine ``name``'s command line (``catalog``: its release's)."""
    return engine(name).positionals(catalog)


# Recipe fields whose values must be names the engine release registers.
_REGISTRY_FIELDS: tuple[tuple[str, str, Callable[[Topology], list[str]]], ...] = (
    ("parsers.tool_call", "tool_call_parser", lambda t: [t.parsers.tool_call] if t.parsers.tool_call else []),
    ("parsers.reasoning", "reasoning_parser", lambda t: [t.parsers.reasoning] if t.parsers.reasoning else []),
    (
        "kv_transfer.connectors",
        "kv_connector",
        lambda t: list(t.kv_transfer.connectors) if t.kv_transfer else [],
    ),
    ("speculative.method", "speculative_method", lambda t: [t.speculative.method] if t.speculative else []),
    ("load_format", "load_format", lambda t: [t.load_format] if t.load_format else []),
)


def _check_names(recipe: Recipe, recipe_file: str, name: str, topo: Topology) -> None:
    version = recipe.engines[topo.engine].version
    try:
        catalog = engine_catalog(recipe, topo.engine)
    except CatalogMissing as exc:
        raise ConfigError(recipe_file, f"engines.{topo.engine}.version", str(exc)) from None
    # a draft checkpoint reaches only an engine whose unit passes it, by a flag its release has
    flag = engine(topo.engine).draft_flag
    if topo.speculative is not None and topo.speculative.draft is not None and catalog.flag(flag or "") is None:
        why = f"has no {flag}" if flag else "takes no draft checkpoint here (vllm's --speculative-config does)"
        raise ConfigError(recipe_file, f"topologies.{name}.speculative.draft", f"{topo.engine} {version} {why}")
    for field, registry, values in _REGISTRY_FIELDS:
        known = catalog.registries.get(registry)
        for value in values(topo):
            if known is None:
                raise ConfigError(
                    recipe_file,
                    f"topologies.{name}.{field}",
                    f"{topo.engine} {version} does not support {field.split('.')[0]} (found {value!r})",
                )
            if value not in known:
                raise ConfigError(
                    recipe_file,
                    f"topologies.{name}.{field}",
                    f"{topo.engine} {version} has no {registry} {value!r} (known: {', '.join(known)})",
                )


def _check_router_address(inventory: Inventory, tp: TopologyPlacement) -> None:
    if tp.router is not None and tp.topology.expose is not None and not is_ip_address(tp.router.address):
        raise ConfigError(
            f"{inventory.source}: host {tp.router.name}",
            "kimi_address",
            f"topology {tp.name}'s engines let in their router's host by IP address (an nftables "
            f"rule on their API port): set the host's IP address, found {tp.router.address!r}",
        )


def _check_hosts(inventory: Inventory, tp: TopologyPlacement) -> None:
    kv = tp.topology.kv_transfer
    if kv is None:
        return
    if tp.topology.mooncake_master:
        # every address the master's unit lets in: the engine hosts' and its own host's
        for h in [*(p.host for p in tp.engines), *([tp.router] if tp.router else [])]:
            if not is_ip_address(h.address):
                raise ConfigError(
                    f"{inventory.source}: host {h.name}",
                    "kimi_address",
                    f"topology {tp.name}'s Mooncake master lets in its hosts by IP address "
                    f"(systemd's IPAddressAllow=): set the host's IP address, found {h.address!r}",
                )
    if kv.transport != "rdma":
        return
    for p in tp.engines:
        if not p.host.vars.kimi_rdma_devices:
            raise ConfigError(
                f"{inventory.source}: host {p.host.name}",
                "kimi_rdma_devices",
                f"topology {tp.name} moves KV cache over RDMA: list the host's RDMA devices",
            )


def _engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    return engine(placement.topology.engine).unit(recipe, recipe_file, placement)


def _check_argv(recipe: Recipe, recipe_file: str, placement: Placement, unit: Unit) -> None:
    catalog = engine_catalog(recipe, placement.topology.engine)
    where = f"topologies.{placement.topology_name}"
    host = placement.host.name
    launch = catalog.launch[1:]
    if tuple(unit.argv[1 : 1 + len(launch)]) != launch:
        raise ConfigError(
            recipe_file, where, f"host {host}: {unit.name} does not start with {' '.join(catalog.launch)}"
        )
    for problem in catalog.problems(unit.argv, argv_positionals(placement.topology.engine, catalog)):
        raise ConfigError(recipe_file, where, f"host {host}: {unit.name}: {problem}")


def _check_ports(recipe_file: str, plan: HostPlan) -> None:
    seen: dict[int, str] = {}
    for unit in plan.units:
        for label, port in unit.every_port().items():
            who = f"{unit.name} {label}"
            if port in seen:
                raise ConfigError(
                    recipe_file,
                    f"topologies.{plan.topology}.ports",
                    f"host {plan.host}: {seen[port]} and {who} both use port {port}",
                )
            seen[port] = who


def _host_plan(recipe: Recipe, placement: Placement, units: tuple[Unit, ...]) -> HostPlan:
    topo = placement.topology
    p = placement.pool.parallel
    version = recipe.engines[topo.engine].version
    return HostPlan(
        host=placement.host.name,
        address=placement.host.address,
        topology=placement.topology_name,
        pool=placement.pool_name,
        role=placement.pool.role,
        node_role=node_role(placement),
        engine=topo.engine,
        engine_version=version,
        instance=placement.instance,
        node_rank=placement.node_rank,
        nodes=placement.nodes,
        leader=placement.leader.name,
        leader_address=placement.leader.address,
        tp=p.tp,
        dp=p.dp,
        pp=p.pp,
        ep=p.ep,
        dp_local=placement.dp_local,
        dp_start_rank=placement.dp_start_rank,
        accelerator_vendor=topo.accelerators.vendor,
        accelerator_model=topo.accelerators.model or CPU_ANY,
        accelerators=topo.accelerators.per_host,
        accelerator_memory_gib=topo.accelerators.memory_gib,
        engine_dir=engine_dir(recipe, topo.engine),
        model_dir=model_dir(recipe),
        units=units,
    )


def _router_plan(recipe: Recipe, tp: TopologyPlacement) -> HostPlan:
    topo = tp.topology
    assert topo.router is not None
    assert tp.router is not None
    master = mooncake_master_unit(recipe, tp)
    units = tuple(u for u in (master, router_unit(recipe, tp), gateway_unit(recipe, tp)) if u is not None)
    package = topo.router.package
    return HostPlan(
        host=tp.router.name,
        address=tp.router.address,
        topology=tp.name,
        pool="router",
        role="router",
        node_role="router",
        engine=package,
        engine_version=recipe.routers[package].version,
        instance=0,
        node_rank=0,
        nodes=1,
        leader=tp.router.name,
        leader_address=tp.router.address,
        tp=0,
        dp=0,
        pp=0,
        ep=0,
        dp_local=0,
        dp_start_rank=0,
        accelerator_vendor=NONE.name,
        accelerator_model="none",
        accelerators=0,
        accelerator_memory_gib=0,
        engine_dir=router_dir(recipe, package),
        model_dir="",
        units=units,
    )


def plan(recipe: Recipe, recipe_file: str, inventory: Inventory, only: str | None = None) -> Plan:
    """Plan every host of ``inventory`` (or of topology ``only``); raise ``ConfigError`` on any fault."""
    hosts: list[HostPlan] = []
    for tp in place(recipe, inventory, only):
        _check_names(recipe, recipe_file, tp.name, tp.topology)
        _check_hosts(inventory, tp)
        _check_router_address(inventory, tp)
        for placement in tp.engines:
            unit = _engine_unit(recipe, recipe_file, placement)
            _check_argv(recipe, recipe_file, placement, unit)
            unit = with_compile_cache(recipe, placement, unit)
            if tp.router is not None:
                # An engine behind a router answers that router's host alone (and its own).
                unit = guarded(unit, recipe.paths.config, (tp.router.address,))
            gateway = engine_gateway_unit(recipe, placement, unit)
            hosts.append(_host_plan(recipe, placement, (unit,) if gateway is None else (unit, gateway)))
        if tp.router is not None:
            hosts.append(_router_plan(recipe, tp))
    for host_plan in hosts:
        _check_ports(recipe_file, host_plan)
    return Plan(recipe=recipe_file, inventory=inventory.source, hosts=tuple(hosts))
