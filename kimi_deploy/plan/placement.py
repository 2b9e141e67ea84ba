"""Placing inventory hosts into a recipe's topologies: which topology, pool, instance and rank.

Rules (each failure is one ``ConfigError`` naming the inventory file and host):
- every host is in exactly one topology's ``group``;
- inside it, every host is in exactly one pool group (or the router group);
- a pool's group holds exactly ``hosts`` hosts; they fill instances in inventory order, and the
  first host of an instance leads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory, InventoryHost
from kimi_deploy.recipe import Pool, Recipe, Topology


@dataclass(frozen=True)
class Placement:
    """One engine host's place in its pool.

    ``dp_local`` data-parallel ranks have their engine core on this host, the first being
    ``dp_start_rank``; a worker host of a tensor-parallel instance spanning hosts has none.
    """

    topology_name: str
    topology: Topology
    pool_name: str
    pool: Pool
    host: InventoryHost
    instance: int
    node_rank: int
    nodes: int
    leader: InventoryHost
    dp_local: int
    dp_start_rank: int
    store_address: str | None = None


@dataclass(frozen=True)
class TopologyPlacement:
    name: str
    topology: Topology
    engines: tuple[Placement, ...]
    router: InventoryHost | None

    def leaders(self, pool_role: str) -> tuple[Placement, ...]:
        return tuple(p for p in self.engines if p.pool.role == pool_role and p.node_rank == 0)


def _hosts(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def hosts_per_instance(topology: Topology, pool: Pool) -> int:
    return max(1, pool.parallel.size // topology.accelerators.per_host)


def _topology_of(recipe: Recipe, inventory: Inventory, host: InventoryHost) -> str:
    names = [n for n, t in recipe.topologies.items() if t.group in host.groups]
    where = f"{inventory.source}: host {host.name}"
    if not names:
        expected = ", ".join(sorted(t.group for t in recipe.topologies.values()))
        raise ConfigError(where, "", f"in no topology group of the recipe (expected one of: {expected})")
    if len(names) > 1:
        raise ConfigError(where, "", f"in the groups of several topologies: {', '.join(names)}")
    return names[0]


def _place_topology(inventory: Inventory, name: str, topo: Topology, members: list[InventoryHost]) -> TopologyPlacement:
    pool_groups = {p.group: pool_name for pool_name, p in topo.pools.items()}
    router_group = topo.router.group if topo.router else None
    in_pool: dict[str, list[InventoryHost]] = {pool_name: [] for pool_name in topo.pools}
    router_hosts: list[InventoryHost] = []
    for host in members:
        where = f"{inventory.source}: host {host.name}"
        found = [g for g in host.groups if g in pool_groups or g == router_group]
        if not found:
            expected = sorted([*pool_groups, *([router_group] if router_group else [])])
            raise ConfigError(where, "", f"topology {name}: in no pool (expected one of groups: {', '.join(expected)})")
        if len(found) > 1:
            raise ConfigError(where, "", f"topology {name}: in several pools: {', '.join(found)}")
        if found[0] == router_group:
            router_hosts.append(host)
        else:
            in_pool[pool_groups[found[0]]].append(host)

    placements: list[Placement] = []
    for pool_name, pool in topo.pools.items():
        hosts = in_pool[pool_name]
        if len(hosts) != pool.hosts:
            size = "too few" if len(hosts) < pool.hosts else "too many"
            raise ConfigError(
                inventory.source,
                f"group {pool.group}",
                f"topology {name}: pool {pool_name} needs {_hosts(pool.hosts)}, found {len(hosts)} ({size})",
            )
        per_instance = hosts_per_instance(topo, pool)
        # Data-parallel ranks spread over the instance's hosts; when tp*pp spans hosts instead,
        # the single rank (dp is then 1) lives on the leader.
        spread = pool.parallel.dp >= per_instance
        dp_local = pool.parallel.dp // per_instance if spread else pool.parallel.dp
        for index, host in enumerate(hosts):
            instance, rank = divmod(index, per_instance)
            placements.append(
                Placement(
                    topology_name=name,
                    topology=topo,
                    pool_name=pool_name,
                    pool=pool,
                    host=host,
                    instance=instance,
                    node_rank=rank,
                    nodes=per_instance,
                    leader=hosts[instance * per_instance],
                    dp_local=dp_local if spread or rank == 0 else 0,
                    dp_start_rank=rank * dp_local if spread else 0,
                )
            )
    router = None
    if topo.router is not None:
        if len(router_hosts) != 1:
            raise ConfigError(
                inventory.source,
                f"group {topo.router.group}",
                f"topology {name}: the router needs exactly 1 host, found {len(router_hosts)}",
            )
        router = router_hosts[0]
        # The router host also runs the topology's shared stores (the Mooncake master).
        placements = [replace(p, store_address=router.address) for p in placements]
    return TopologyPlacement(name=name, topology=topo, engines=tuple(placements), router=router)


def place(recipe: Recipe, inventory: Inventory, only: str | None = None) -> tuple[TopologyPlacement, ...]:
    """Place every host of the inventory; with ``only``, keep that topology (which must have hosts)."""
    if only is not None and only not in recipe.topologies:
        known = ", ".join(recipe.topologies)
        raise ConfigError(inventory.source, "", f"topology {only!r} is not in the recipe (known: {known})")
    members: dict[str, list[InventoryHost]] = {name: [] for name in recipe.topologies}
    for host in inventory.hosts:
        members[_topology_of(recipe, inventory, host)].append(host)
    if only is not None and not members[only]:
        group = recipe.topologies[only].group
        raise ConfigError(inventory.source, "", f"topology {only}: group {group} has no hosts")
    out = []
    for name, topo in recipe.topologies.items():
        if members[name] and (only is None or name == only):
            out.append(_place_topology(inventory, name, topo, members[name]))
    if not out:
        raise ConfigError(inventory.source, "", "no host is in any topology group of the recipe")
    return tuple(out)
