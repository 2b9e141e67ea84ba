"""Which host makes each compile cache, which hosts serve it, which receive it: decided once a run.

Pure: from every host's plan, converge and probe, and the manifests the controller holds
(``kimi_deploy.compile_cache.pins``). Hosts whose engine units have the same key
(``kimi_deploy.compile_cache.key``) would compile the same code. For each key:

- a host holds it when its probe found the artifact whole with the manifest the controller holds
  (with none held yet: the first host of the run, in plan order, that holds one whole; the
  controller holds that one from then on). A host whose artifact is another is not a source.
- A host that does not hold it receives it from the holders, through the weights' relay (the
  recipe's ``weights.fan_out`` port and the run's transfer key), before its engine starts; the
  holders serve it only while they do. Without ``weights.fan_out`` nothing moves between hosts.
- A host that holds it (or receives it) and whose engine has not been given that copy gets it
  before its engine (re)starts, the next start then skips the compile.
- When no host of the run holds it, the first host of the key whose engine (re)starts, in the
  earliest batch of the start order in which one does (``kimi_deploy.plan.start_batches``), and
  whose engine writes the cache (of a key the ranks share, ``Engine.compile_cache_ranks``, a host
  of node rank 0: the others' folders stay empty), compiles as it would, and once its batch
  answers its smoke tests its cache is packed into the artifact: the controller holds the
  manifest its pack answers. The hosts of the key that (re)start in a later batch receive it in
  this run, before their batch starts, from the host that packed it (which serves it for the rest
  of the run); those of its own batch compile too, at the same time (waiting for one host to
  compile and then copying would make the first start slower, not faster), and the hosts that do
  not (re)start receive it in the next run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimi_deploy.compile_cache.pins import Pins
from kimi_deploy.converge.plan import Converge
from kimi_deploy.engines import engine
from kimi_deploy.hostside.compile_cache_found import manifest_digest
from kimi_deploy.hostside.requests import CompileCachePackRequest, CompileCachePlaceRequest, Lock, PeerSource
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.servespec import CompileCache
from kimi_deploy.releases.host_paths import unit_cache_dir

# What a pack may hold: vLLM 0.32.0's CPU cache of the demo's model is 65 files, 4.6 MiB; a GPU
# engine's is some hundreds of files per rank. The manifest travels in argv (zlib, base64).
MOST_FILES = 2000
MOST_BYTES = 8 << 30


@dataclass(frozen=True)
class FromThisRun:
    """The artifact a host of an earlier batch packs in this run, placed on this host before its
    own batch starts (``operations.compile_cache.placed_from_run``)."""

    # the artifact's name (``<unit>-<key>``), by which the run keeps the manifest the pack answered
    name: str
    # the host that packs it
    source: str
    # ``compile_cache_place.py``'s request from that host, less the manifest: it is the one the
    # pack answers, which the controller holds once the pack is done (``manifest`` is empty here)
    request: CompileCachePlaceRequest


@dataclass(frozen=True)
class CompileCacheStep:
    """One engine unit's compile cache on one host, this run."""

    unit: str
    cache: CompileCache
    # the manifest the controller holds (None: none yet)
    manifest: Lock | None
    # this host serves the artifact to these addresses while they fetch it
    serves: tuple[str, ...] = ()
    # the artifact placed here and given to the engine before it starts (None: nothing to do)
    place: CompileCachePlaceRequest | None = None
    # what this host's engine compiles is packed once its batch answers its smoke tests (None: not here)
    pack: CompileCachePackRequest | None = None
    # a line for the run's log: why a cache this host holds is not used
    note: str | None = None
    # the batch of the start order this host's engine (re)starts in this run
    batch: int = 0
    # with ``pack``: the addresses of the hosts of later batches that receive what it packs, served
    # from the pack on until the run ends
    serves_packed: tuple[str, ...] = ()
    # a host of a later batch than the one that packs: what it receives of that pack in this run
    receives: FromThisRun | None = None

    @property
    def moves(self) -> bool:
        """It crosses the network to or from this host (the run's transfer key is needed)."""
        return bool(self.serves or self.serves_packed or self.receives) or bool(self.place and self.place["peers"])

    @property
    def in_batches(self) -> bool:
        """This host takes the steps of its key's cache inside the start order: it packs after its
        batch, or receives before its own. It takes both kinds in every batch of engines (doing
        nothing where they are not its), so that the hosts of the key take them in one order."""
        return self.pack is not None or self.receives is not None


@dataclass(frozen=True)
class _Host:
    name: str
    address: str
    port: int | None
    key_file: str
    user: str
    unit: str
    cache: CompileCache
    # the probe's answer of the artifact and the engine's copy (``hostside.compile_cache_found``)
    found: Mapping[str, Any] | None
    starts: bool
    # its engine writes the cache it compiles: every rank of an engine whose ranks keep their own,
    # node rank 0 alone of one whose ranks share one (JAX's, which process 0 alone writes)
    writes: bool


def _hosts(hosts: Sequence[tuple[DeployPlan, Converge, Any, frozenset[str]]]) -> list[_Host]:
    out = []
    for deploy, todo, probed, restarting in hosts:
        fan_out = deploy.recipe.weights.fan_out
        key_file = todo.checkpoints[0].peer_key_file if todo.checkpoints else ""
        caches = probed.get("compile_caches") or {} if isinstance(probed, dict) else {}
        shared = engine(deploy.recipe.topologies[deploy.spec.topology].engine).compile_cache_ranks == "shared"
        for unit in deploy.spec.units:
            if unit.compile_cache is None:
                continue
            out.append(
                _Host(
                    name=deploy.spec.host,
                    address=deploy.host.address,
                    port=fan_out.port if fan_out else None,
                    key_file=key_file,
                    user=todo.user,
                    unit=unit.name,
                    cache=unit.compile_cache,
                    found=caches.get(unit.compile_cache.source),
                    starts=unit.name in restarting,
                    writes=not shared or deploy.spec.node_rank == 0,
                )
            )
    return out


def _holds(h: _Host, manifest: Lock | None) -> bool:
    found = h.found or {}
    return bool(found.get("whole")) and found.get("manifest") is not None and found.get("manifest") == manifest


def plan_compile_caches(
    hosts: Sequence[tuple[DeployPlan, Converge, Any, frozenset[str]]],
    pins: Pins,
    batches: Mapping[str, int] | None = None,
) -> dict[str, list[CompileCacheStep]]:
    """Each host's compile cache steps (``hosts``: each host's plan, converge, probe answer and the
    units that (re)start on it this run, in run order; ``batches``: the batch of the start order
    each host's engines (re)start in, 0 where none is said). Takes a manifest into ``pins`` when
    the controller holds none and a host of the run holds one whole."""
    by_key: dict[str, list[_Host]] = {}
    for h in _hosts(hosts):
        by_key.setdefault(h.cache.source, []).append(h)
    batch = dict(batches or {})
    # the weights' relay serves one folder at a time: a host serves one pack through the run
    relaying: set[str] = set()
    out: dict[str, list[CompileCacheStep]] = {}
    for source, group in by_key.items():
        name = source.rsplit("/", 1)[-1]
        manifest = pins.get(name)
        if manifest is None:
            first = next((h for h in group if (h.found or {}).get("whole") and (h.found or {}).get("manifest")), None)
            if first is not None:
                manifest = dict((first.found or {})["manifest"])
                pins.put(name, manifest, first.name)
        holders = [h for h in group if _holds(h, manifest)]
        fetchers = [h for h in group if h not in holders and holders and h.port is not None]
        compiler = None if holders else _compiler(group, batch)
        receivers: list[_Host] = []
        if compiler is not None and compiler.port is not None and compiler.name not in relaying:
            receivers = [h for h in group if h.starts and h.port is not None and _later(h, compiler, batch)]
            if receivers:
                relaying.add(compiler.name)
        for h in group:
            out.setdefault(h.name, []).append(
                _step(
                    h,
                    name=name,
                    manifest=manifest,
                    holders=holders,
                    fetchers=fetchers,
                    compiler=compiler,
                    receivers=receivers,
                    batch=batch.get(h.name, 0),
                )
            )
    return out


def _compiler(group: list[_Host], batch: Mapping[str, int]) -> _Host | None:
    """The host that compiles a key no host of the run holds: the first, in run order, of those
    whose engine (re)starts and writes the cache, in the earliest batch in which one of the key's
    does; None when none does."""
    starting = [h for h in group if h.starts and h.writes]
    if not starting:
        return None
    earliest = min(batch.get(h.name, 0) for h in starting)
    return next(h for h in starting if batch.get(h.name, 0) == earliest)


def _later(h: _Host, compiler: _Host, batch: Mapping[str, int]) -> bool:
    return batch.get(h.name, 0) > batch.get(compiler.name, 0)


def _place_request(h: _Host, manifest: Lock, sources: list[_Host]) -> CompileCachePlaceRequest:
    """``compile_cache_place.py``'s request on ``h``: the artifact verified against ``manifest``,
    fetched from ``sources`` through the weights' relay (none: the host holds it) and given to
    its engine."""
    peers: list[PeerSource] = [{"host": s.name, "url": f"http://{s.address}:{s.port}"} for s in sources]
    return {
        "dir": h.cache.source,
        "manifest": manifest,
        "peers": peers,
        "peer_key_file": h.key_file if peers else None,
        "progress_log": f"{h.cache.source}.log",
        "engine_dir": h.cache.target,
        "owner_root": unit_cache_dir(h.unit),
        "user": h.user,
    }


def _step(
    h: _Host,
    *,
    name: str,
    manifest: Lock | None,
    holders: list[_Host],
    fetchers: list[_Host],
    compiler: _Host | None,
    receivers: list[_Host],
    batch: int,
) -> CompileCacheStep:
    found = h.found or {}
    note = None
    if found.get("manifest") is not None and manifest is not None and h not in holders:
        held = manifest_digest(dict(manifest))
        note = f"compile cache {name}: the host's is not the one the controller holds ({held}): not used"
    serves = tuple(f.address for f in fetchers) if h in holders and fetchers else ()
    place: CompileCachePlaceRequest | None = None
    if manifest is not None and (h in holders or h in fetchers):
        given = {"key": name, "manifest": manifest_digest(dict(manifest))}
        if h in fetchers or found.get("given") != given:
            place = _place_request(h, dict(manifest), holders if h in fetchers else [])
    pack: CompileCachePackRequest | None = None
    if compiler is h:
        pack = {
            "source": h.cache.target,
            "user": h.user,
            "dir": h.cache.source,
            "most_files": MOST_FILES,
            "most_bytes": MOST_BYTES,
        }
    receives = None
    if compiler is not None and h in receivers:
        receives = FromThisRun(name, compiler.name, _place_request(h, {}, [compiler]))
    return CompileCacheStep(
        h.unit,
        h.cache,
        manifest,
        serves=serves,
        place=place,
        pack=pack,
        note=note,
        batch=batch,
        serves_packed=tuple(r.address for r in receivers) if compiler is h else (),
        receives=receives,
    )
