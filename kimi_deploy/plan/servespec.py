"""What the planner decides for each host: its place in the topology and the units it runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

UnitKind = Literal["engine", "router", "mooncake-master", "gateway"]
HostRole = Literal["serve", "prefill", "decode", "router"]
NodeRole = Literal["single", "leader", "worker", "router"]


@dataclass(frozen=True)
class ConfigFile:
    """A file a unit reads, rendered from ``template`` with ``data``."""

    template: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ApiGuard:
    """The nftables table an engine unit loads before each start (``kimi_deploy.render.engine_guard``):
    ``file`` (an nft script, one of the unit's ``files``) holds ``port``, its API, open to the host
    itself and the addresses it ``admits`` (None: every address)."""

    file: str
    table: str
    port: int
    admits: tuple[str, ...] | None


@dataclass(frozen=True)
class CompileCache:
    """The compile cache an engine unit starts from (``kimi_deploy.compile_cache.key``): ``source``,
    the host's artifact folder of ``key`` (root's), copied into ``target``, the folder the engine
    keeps that cache in and writes, before the engine starts."""

    key: str
    source: str
    target: str


@dataclass(frozen=True)
class Unit:
    """One systemd service on one host.

    ``argv`` is the exact command line and never holds a secret. ``secret_env`` names variables
    the unit reads from its secret EnvironmentFile; ``secret_files`` maps an absolute path to the
    template of a secret file the engine reads itself, as a systemd credential named after the
    file (``kimi_deploy.render.credentials``). Both are root's alone, read by systemd at each start, and
    written only by a deploy, never by ``plan --render``. ``listens`` maps a label to each
    port the unit binds; ``bind`` is the address of its HTTP API. ``stage`` orders starts across
    the topology: 0 stores (Mooncake master), 1 engine leaders, 2 engine workers, 3 routers.
    ``local_listens`` are ports it binds on loopback alone, whatever ``bind`` is.
    ``files`` are the other config files the unit reads, by absolute path. ``peers``, when
    given, are the only addresses besides loopback the unit exchanges packets with (systemd's
    IPAddressAllow=): for a service that checks no key and binds more than it is told.
    ``guard``: who may open a connection to an engine's API port beyond loopback.
    ``compile_cache``: the compile cache of an engine whose launch compiles kernels.
    """

    name: str
    kind: UnitKind
    stage: int
    description: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    listens: Mapping[str, int]
    bind: str
    secret_env: tuple[str, ...] = ()
    secret_files: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, ConfigFile] = field(default_factory=dict)
    peers: tuple[str, ...] = ()
    local_listens: Mapping[str, int] = field(default_factory=dict)
    guard: ApiGuard | None = None
    compile_cache: CompileCache | None = None

    def every_port(self) -> dict[str, int]:
        """Every port the unit binds, on any address, by label."""
        return {**self.listens, **self.local_listens}


@dataclass(frozen=True)
class HostPlan:
    """One host's serve spec: its place in the topology and the units it runs."""

    host: str
    address: str
    topology: str
    pool: str
    role: HostRole
    node_role: NodeRole
    engine: str
    engine_version: str
    instance: int
    node_rank: int
    nodes: int
    leader: str
    leader_address: str
    tp: int
    dp: int
    pp: int
    ep: int
    dp_local: int
    dp_start_rank: int
    accelerator_vendor: str
    accelerator_model: str
    accelerators: int
    accelerator_memory_gib: int
    engine_dir: str
    model_dir: str
    units: tuple[Unit, ...]


# The accelerator model of a CPU topology that names no CPU model: any CPU serves.
CPU_ANY = "any"


@dataclass(frozen=True)
class Plan:
    """Every planned host, by topology then inventory order."""

    recipe: str
    inventory: str
    hosts: tuple[HostPlan, ...]

    def for_host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.host == name:
                return h
        raise KeyError(name)

    def topology(self, name: str) -> tuple[HostPlan, ...]:
        return tuple(h for h in self.hosts if h.topology == name)
