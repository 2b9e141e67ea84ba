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
- When no host of the run holds it, the first host of the key whose engine (re)starts compiles
  as it would, and once it answers its smoke test its cache is packed into the artifact: the
  controller holds the manifest its pack answers, and the next run fans it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimi_deploy.compile_cache.pins import Pins
from kimi_deploy.converge.plan import Converge
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
    # what this host's engine compiles is packed once it answers its smoke test (None: not here)
    pack: CompileCachePackRequest | None = None
    # a line for the run's log: why a cache this host holds is not used
    note: str | None = None

    @property
    def moves(self) -> bool:
        """It crosses the network to or from this host (the run's transfer key is needed)."""
        return bool(self.serves) or bool(self.place and self.place["peers"])


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


def _hosts(hosts: Sequence[tuple[DeployPlan, Converge, Any, frozenset[str]]]) -> list[_Host]:
    out = []
    for deploy, todo, probed, restarting in hosts:
        fan_out = deploy.recipe.weights.fan_out
        key_file = todo.checkpoints[0].peer_key_file if todo.checkpoints else ""
        caches = probed.get("compile_caches") or {} if isinstance(probed, dict) else {}
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
                )
            )
    return out


def _holds(h: _Host, manifest: Lock | None) -> bool:
    found = h.found or {}
    return bool(found.get("whole")) and found.get("manifest") is not None and found.get("manifest") == manifest


def plan_compile_caches(
    hosts: Sequence[tuple[DeployPlan, Converge, Any, frozenset[str]]], pins: Pins
) -> dict[str, list[CompileCacheStep]]:
    """Each host's compile cache steps (``hosts``: each host's plan, converge, probe answer and the
    units that (re)start on it this run, in run order). Takes a manifest into ``pins`` when the
    controller holds none and a host of the run holds one whole."""
    by_key: dict[str, list[_Host]] = {}
    for h in _hosts(hosts):
        by_key.setdefault(h.cache.source, []).append(h)
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
        compiler = None if holders else next((h for h in group if h.starts), None)
        for h in group:
            out.setdefault(h.name, []).append(
                _step(h, name=name, manifest=manifest, holders=holders, fetchers=fetchers, compiler=compiler)
            )
    return out


def _step(
    h: _Host,
    *,
    name: str,
    manifest: Lock | None,
    holders: list[_Host],
    fetchers: list[_Host],
    compiler: _Host | None,
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
            peers: list[PeerSource] = [
                {"host": s.name, "url": f"http://{s.address}:{s.port}"} for s in holders if h in fetchers
            ]
            place = {
                "dir": h.cache.source,
                "manifest": dict(manifest),
                "peers": peers,
                "peer_key_file": h.key_file if peers else None,
                "progress_log": f"{h.cache.source}.log",
                "engine_dir": h.cache.target,
                "owner_root": unit_cache_dir(h.unit),
                "user": h.user,
            }
    pack: CompileCachePackRequest | None = None
    if compiler is h:
        pack = {
            "source": h.cache.target,
            "user": h.user,
            "dir": h.cache.source,
            "most_files": MOST_FILES,
            "most_bytes": MOST_BYTES,
        }
    return CompileCacheStep(h.unit, h.cache, manifest, serves=serves, place=place, pack=pack, note=note)
