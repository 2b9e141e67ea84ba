"""What kimi-deploy knows of a serving engine, behind one interface: one module per engine
(``kimi_deploy/engines/<name>.py``) gives an ``Engine``, and the registry finds it by the name a
recipe uses (``kimi_deploy.engines.engine``). A new engine, a TPU backend or a CPU build is a new
module and a line of the registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kimi_deploy.compile_cache.key import CacheRanks
from kimi_deploy.plan.listen import gatewayed
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import EngineName, Recipe, Topology
from kimi_deploy.releases.catalog import Catalog


def _no_packages(topology: Topology) -> tuple[str, ...]:
    return ()


def _no_compile_cache(unit: Unit) -> str | None:
    return None


def _launch_prefix(catalog: Catalog) -> int:
    return len(catalog.launch)


@dataclass(frozen=True)
class Engine:
    name: EngineName
    # the engine's own API port, where a recipe sets none (its documentation's default)
    default_api_port: int
    # the engine's unit on a host of ``placement``: its command line (checked against the release's
    # flag catalog by the planner), environment, files, ports and the secrets it reads;
    # ``ConfigError`` (naming the recipe field) for a layout the engine cannot serve
    unit: Callable[[Recipe, str, Placement], Unit]
    # arguments the command line has before its first flag: the catalog's launch prefix, and
    # what the engine takes after it (``vllm serve MODEL``)
    positionals: Callable[[Catalog], int] = _launch_prefix
    # Debian packages a host needs beside the release to serve ``topology`` with this engine
    host_packages: Callable[[Topology], tuple[str, ...]] = _no_packages
    # the API key's name in the engine's secret config file, for an engine that reads its key
    # from one (SGLang's ``--config`` YAML) rather than from its environment
    secret_file_key: str | None = None
    # the flag its unit passes a speculative draft's folder with (vLLM's ``--speculative-config``
    # ``model``), None: it takes no draft checkpoint; the pinned release's catalog must have it
    draft_flag: str | None = None
    # HiCache (``topologies.*.hicache``, host-memory KV cache): None where the engine serves it,
    # else why not, the recipe's error line (``{engine}``: the engine's name)
    hicache_refusal: str | None = "hicache is an SGLang feature, engine is {engine}"
    # it has a CPU build, which serves ``cpu`` accelerators (vLLM's)
    cpu_build: bool = False
    # its release holds the benchmark's load generator (``vllm bench serve``)
    load_generator: bool = False
    # its /metrics gauges of KV cache use, each a fraction, read while the context ladder's probe
    # and the benchmark's load run; empty: none known, none read
    kv_usage_metrics: tuple[str, ...] = ()
    # the folder its ``unit`` keeps what it compiles at start in, when that launch compiles and a
    # start from a copy of the folder skips the compile (``kimi_deploy.compile_cache``); None: none
    compile_cache: Callable[[Unit], str | None] = _no_compile_cache
    # who writes and reads that cache in an instance over several hosts: "each" rank compiles and
    # keeps its own (a key per rank); "shared": every rank reads the one cache that node rank 0
    # alone writes (JAX's), so every rank of the launch has one key and a node-rank-0 host packs it
    compile_cache_ranks: CacheRanks = "each"
    # its own log lines that time a start (``hostside.start_phases``): per phase ("engine load",
    # "compile"), the readings to try in turn, ``{"took": PATTERN}`` (group 1: seconds) or
    # ``{"between": [A, B]}``; and the line it prints once it serves (None: none read)
    start_phases: Mapping[str, tuple[Mapping[str, object], ...]] = field(default_factory=dict)
    ready_line: str | None = None

    def client_port(self, topology: Topology) -> int:
        """The port clients (or the router) reach the topology's API on: ``ports.api`` or the
        engine's default."""
        return topology.ports.api if topology.ports.api is not None else self.default_api_port

    def api_port(self, topology: Topology) -> int:
        """The port the engine's API listens on for ``topology``: its client port, or
        ``ports.api_backend`` behind a gateway of its own (``kimi_deploy.plan.listen.gatewayed``)."""
        return topology.ports.api_backend if gatewayed(topology) else self.client_port(topology)
