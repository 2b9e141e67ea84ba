"""What a converge must make true on one host, decided on the controller before any change.

Pure apart from reading local files (the lock, secrets named by the recipe); the controller's
environment (secrets named by variable, the Hub token) is passed in. From a host's plan it
derives the releases to install, the weights to hold, the files to render, and for each unit the
digest of everything it reads (a changed digest is what restarts it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kimi_deploy.engines import engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.preflight import Needs
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.probe_types import Listener, UnitState
from kimi_deploy.hostside.requests import (
    ReleaseIdentity,
    ReleaseRecord,
    SmokeAsk,
    StateRequest,
    SyncRequest,
    UnitAsk,
)
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.servespec import HostPlan, Unit
from kimi_deploy.plan.start_batches import batch_of
from kimi_deploy.recipe import Checkpoint, Recipe, RouterFallback, SecretRef
from kimi_deploy.releases.committed_locks import with_committed
from kimi_deploy.releases.host_libraries import MOONCAKE_CLIENT, MOONCAKE_MASTER, NIXL_CLIENT
from kimi_deploy.releases.host_libraries import packages as library_packages
from kimi_deploy.releases.host_paths import checkpoint_dir, tool_dir
from kimi_deploy.releases.venvs import VenvRelease, engine_releases, router_releases
from kimi_deploy.render.engine_guard import PACKAGES as GUARD_PACKAGES
from kimi_deploy.render.files import RenderedFile, render_host
from kimi_deploy.render.gateway import MASKED as GATEWAY_MASKED
from kimi_deploy.render.gateway import PACKAGES as GATEWAY_PACKAGES
from kimi_deploy.render.scrub_units import PROGRESS_LOG, SCRUB_UNIT, scrub_files
from kimi_deploy.render.watchdog_units import WATCHDOG_UNIT, watchdog_config, watchdog_files
from kimi_deploy.secrets import read_secret
from kimi_deploy.serving.router_drain import drain_api
from kimi_deploy.weights.fanout import needs_files
from kimi_deploy.weights.hub_token import controller_token
from kimi_deploy.weights.lockfile import read_lock

PYPI = "https://pypi.org/simple"
# A secret's content where ``kimi-deploy plan`` reads none: its file keeps its path, owner and mode.
WITHHELD = "withheld"


@dataclass(frozen=True)
class WeightsTarget:
    """One checkpoint a host holds (the model, a speculative draft): its revision's folder,
    synced and verified against its lock."""

    repo: str
    revision: str
    path: str
    lock: dict[str, list[Any]]
    python: str
    endpoint: str | None
    full_verify: bool = False
    token: RenderedFile | None = None
    progress_log: str = PROGRESS_LOG
    # where the transfer key of a fan-out goes on the host (see weights_fanout)
    peer_key_file: str = ""
    # the port a source host serves its files to others on, None: every host fetches from the Hub
    fan_out_port: int | None = None
    # the revision's folder in a local mirror (a mount), tried first
    mirror: str | None = None
    # its link in a release folder (``model``, ``draft``) and the recipe field that pins it
    link: str = "model"
    field: str = "model"
    # why ``lock`` is empty: ``kimi-deploy plan`` found no lock (a converge refuses the revision then)
    withheld: str = ""


def transfer_key_file(target: WeightsTarget, key: str) -> RenderedFile:
    """The run's weights transfer ``key`` on a host that serves ``target``'s files to its peers or
    fetches them from them: root's, read by the engine user's group (the peer service)."""
    return RenderedFile(target.peer_key_file, key + "\n", 0o440, "root", secret=True)


def sync_request(target: WeightsTarget) -> SyncRequest:
    """``hostside/weights_sync.py``'s request for ``target``'s revision, the same for a converge's
    sync and the scrub's; a converge adds ``full``, ``peers`` and ``peer_key_file``."""
    return {
        "repo": target.repo,
        "revision": target.revision,
        "dir": target.path,
        "lock": target.lock,
        "endpoint": target.endpoint,
        "token_file": target.token.path if target.token else None,
        "retries": 2,
        "progress_log": target.progress_log,
    }


@dataclass(frozen=True)
class SmokeCheck:
    url: str
    request: SmokeAsk


@dataclass(frozen=True)
class UnitTarget:
    name: str
    release: str
    smoke: SmokeCheck | None
    ports: dict[int, str]
    # start order across the topology: 0 stores, 1 engine leaders, 2 engine workers, 3 routers
    stage: int = 1
    # sha256 of each secret file the unit reads, by path: compared with the host's copy, never
    # recorded nor printed (``release`` leaves secret contents out)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # an engine, which reads the host's weights: restarted when the sync repairs them
    reads_weights: bool = False
    # its other files (its unit file, environment and config files): one written after its last
    # start means what runs is not what they say
    files: tuple[str, ...] = ()


@dataclass(frozen=True)
class Release:
    """The host's release: ``dir`` (named by a digest of all it runs), its record and links."""

    link: str
    dir: str
    record: ReleaseRecord
    links: dict[str, str]
    # what the release folder holds once written (``operations.releases.current``): its record and
    # the copy of every file it renders but secrets, for a rollback; probed like the files
    # themselves, and put back when they drift while it serves
    files: list[RenderedFile] = field(default_factory=list)


@dataclass(frozen=True)
class Converge:
    user: str
    index_url: str
    venvs: list[VenvRelease]
    # the checkpoints the host holds: the model first, then its topology's draft (none on a router)
    checkpoints: tuple[WeightsTarget, ...]
    files: list[RenderedFile]
    units: list[UnitTarget]
    release: Release
    timers: list[str] = field(default_factory=list)
    # Debian packages the units need from the host's archive, and units masked before they install
    packages: list[str] = field(default_factory=list)
    masked: list[str] = field(default_factory=list)
    # a router host's router that drains engines: its API (the probe then reads the engines a
    # drain left out of it: ``kimi_deploy.serving.router_drain``), else None
    router_api: str | None = None

    @property
    def weights(self) -> WeightsTarget | None:
        """The served model's checkpoint (what the smoke test, the scrub and the drills read)."""
        return self.checkpoints[0] if self.checkpoints else None


# What the smoke prompt and the chat template take of the context, at most.
SMOKE_PROMPT_ROOM = 512


def smoke_budget(max_tokens: int, max_model_len: int) -> int:
    """The smoke answer's max_tokens: the recipe's, within what the context leaves after the prompt
    (an engine refuses a request whose prompt and budget exceed max_model_len)."""
    return max(1, min(max_tokens, max_model_len - SMOKE_PROMPT_ROOM))


def digest(files: list[RenderedFile]) -> str:
    """One digest over everything a unit reads: a change to any of them restarts it.

    It is recorded where anyone reads it (the release's id and ``release.json``, the unit's
    applied marker, pyinfra's output), so a secret file counts by its path, owner and mode only:
    the digest confirms no guessed secret. A changed secret restarts its units through
    ``unit_state`` instead.
    """
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.mode:o}\0{f.owner}\0{'secret' if f.secret else 'file'}\0".encode())
        if not f.secret:
            h.update(f.content.encode())
    return h.hexdigest()


def needs_start(release: str, current: UnitState | None) -> bool:
    """Whether a unit must be (re)started: not running, running another release, running with
    a secret it read before it changed (``secrets_changed``) or with another unit file or file
    it reads than the host holds now (``files_changed``), or an engine whose weights the sync
    repairs (``weights_changed``; see ``unit_state``)."""
    return not (
        current is not None
        and current.get("active") == "active"
        and current.get("applied") == release
        and not current.get("secrets_changed")
        and not current.get("files_changed")
        and not current.get("weights_changed")
    )


def unit_state(unit: UnitTarget, state: HostState) -> UnitState | None:
    """``unit``'s state as the host probe found it (``state``: the probe's result), with
    ``secrets_changed`` set when a secret file it reads differs on the host from the one this
    converge puts there (its content: an owner or mode put back changes nothing it read), and
    ``weights_changed`` when it is an engine and the sync repairs the weights it reads:
    ``needs_start`` restarts it then.
    The probe sets ``secrets_changed`` too when such a file changed after the unit's last start."""
    current = state["units"].get(unit.name)
    found = state["files"]
    if current is not None and any(found.get(path) != sha for path, sha in unit.secrets.items()):
        return current | {"secrets_changed": True}
    repaired = any(w["exists"] and needs_files(w) for w in state["weights"].values())
    if current is not None and unit.reads_weights and repaired:
        # files of the revision it serves are missing, changed or unreadable: the engine may hold
        # what it read of them, or have failed on them; it restarts once the sync has repaired them
        return current | {"weights_changed": True}
    return current


def _hub_token(config_dir: str, environ: Mapping[str, str], plan_only: bool = False) -> RenderedFile | None:
    """The controller's Hub token (where huggingface_hub finds it: ``kimi_deploy.weights.hub_token``) as a
    host file only root reads; None when the controller has none (public repositories need none)."""
    token = controller_token(environ)
    if token is None:
        return None
    content = WITHHELD if plan_only else token
    return RenderedFile(f"{config_dir}/secrets/hf-token", content + "\n", 0o600, "root", secret=True)


def key_names(recipe: Recipe, spec: HostPlan) -> list[str]:
    """Every name ``spec``'s units read the topology's key under: their secret environment
    variables, and the engine's key in its secret config file."""
    names = list(dict.fromkeys(name for u in spec.units for name in u.secret_env))
    file_key = engine(recipe.topologies[spec.topology].engine).secret_file_key
    if file_key is not None and any(u.kind == "engine" and u.secret_files for u in spec.units):
        names.append(file_key)
    return names


def hosted_fallback(recipe: Recipe, spec: HostPlan) -> RouterFallback | None:
    """The hosted API whose key (KIMI_FALLBACK_API_KEY) ``spec``'s host is handed: a router host's,
    in a topology with a fallback."""
    router = recipe.topologies[spec.topology].router
    return router.fallback if spec.role == "router" and router is not None else None


def _secrets(deploy: DeployPlan, environ: Mapping[str, str], plan_only: bool = False) -> dict[str, str] | None:
    """The secrets ``deploy``'s units read, by name; ``plan_only``: none read, each one ``WITHHELD``."""
    expose = deploy.recipe.topologies[deploy.spec.topology].expose
    if expose is None:
        return None

    def read(ref: SecretRef, field: str) -> str:
        return WITHHELD if plan_only else read_secret(ref, deploy.recipe_file, field, environ)

    key = read(expose.api_key, f"topologies.{deploy.spec.topology}.expose.api_key")
    secrets = dict.fromkeys(key_names(deploy.recipe, deploy.spec), key)
    hosted = hosted_fallback(deploy.recipe, deploy.spec)
    if hosted is not None:
        where = f"topologies.{deploy.spec.topology}.router.fallback.api_key"
        secrets["KIMI_FALLBACK_API_KEY"] = read(hosted.api_key, where)
    return secrets


def _releases(recipe: Recipe, spec: HostPlan, plan_only: bool = False) -> list[VenvRelease]:
    """The host's releases (``kimi_deploy.releases.venvs``), with their committed locks where the
    recipe names the host's OS (``plan_only``: without, as they change no file: ``validate``
    checks them)."""
    if spec.role == "router":
        releases = router_releases(recipe, spec.topology)
    else:
        releases = engine_releases(recipe, spec.engine, spec.engine_dir)  # type: ignore[arg-type]
    return releases if plan_only else with_committed(recipe, spec.topology, releases)


def _lock(checkpoint: Checkpoint, plan_only: bool) -> tuple[dict[str, list[Any]], str]:
    """``checkpoint``'s lock (compact) and, for ``kimi-deploy plan`` alone, why it has none (the
    lock's own error): a converge refuses a revision without its lock."""
    try:
        return read_lock(checkpoint).compact(), ""
    except ConfigError as exc:
        if not plan_only:
            raise
        return {}, str(exc)


def _checkpoints(deploy: DeployPlan, environ: Mapping[str, str], plan_only: bool = False) -> tuple[WeightsTarget, ...]:
    """The checkpoints an engine host holds (``Recipe.checkpoints``), each at its revision verified
    against its lock; none on a router host."""
    recipe, host_vars = deploy.recipe, deploy.host.vars
    if deploy.spec.role == "router":
        return ()
    tools = tool_dir(recipe, "huggingface_hub", recipe.tools.huggingface_hub)
    token = _hub_token(recipe.paths.config, environ, plan_only)
    mirror = recipe.weights.mirror_path

    def target(field: str, checkpoint: Checkpoint) -> WeightsTarget:
        lock, withheld = _lock(checkpoint, plan_only)
        return WeightsTarget(
            repo=checkpoint.repo,
            revision=checkpoint.revision,
            path=checkpoint_dir(recipe, checkpoint),
            lock=lock,
            python=f"{tools}/bin/python",
            endpoint=host_vars.kimi_hf_endpoint,
            full_verify=host_vars.kimi_verify == "full",
            token=token,
            peer_key_file=f"{recipe.paths.config}/secrets/weights-transfer-key",
            fan_out_port=recipe.weights.fan_out.port if recipe.weights.fan_out else None,
            mirror=f"{mirror}/{checkpoint.dir_name}/{checkpoint.revision}" if mirror else None,
            link=field.rsplit(".", 1)[-1],
            field=field,
            withheld=withheld,
        )

    return tuple(target(field, checkpoint) for field, checkpoint in recipe.checkpoints(deploy.spec.topology))


def unit_key(recipe: Recipe, spec: HostPlan, unit: Unit) -> tuple[str | None, str | None]:
    """Where on its host ``unit``'s key is (the topology's client key): the secret file, and the
    variable holding it there; ``(None, None)`` for a unit that checks no key."""
    if unit.secret_env:
        return f"{recipe.paths.config}/secrets/{unit.name}.env", unit.secret_env[0]
    if unit.secret_files:
        return next(iter(unit.secret_files)), engine(recipe.topologies[spec.topology].engine).secret_file_key
    return None, None


def _smoke(recipe: Recipe, spec: HostPlan, unit: Unit, weights: WeightsTarget | None) -> SmokeCheck | None:
    """The on-host smoke check of an engine's API, or of the gateway in front of a router or an
    engine (whose smoke test goes through it to the engines and back); None for other units."""
    api = unit.listens.get("router", unit.listens.get("api"))
    if api is None or unit.kind not in ("engine", "gateway"):
        return None
    # An engine reads the host's weights: its smoke test, should it exit before it is ready,
    # drops their verification cache (the next converge hashes them again).
    verify_cache = f"{weights.path}/.kimi/verify-cache.json" if unit.kind == "engine" and weights else None
    # A tool-call round trip where the engines parse tool calls (the router passes them on).
    tool = recipe.smoke.tool_call if recipe.topologies[spec.topology].parsers.tool_call else None
    # A unit bound to every address is reached on loopback by the on-host check.
    host = LOOPBACK if unit.bind in (LOOPBACK, "0.0.0.0", "::") else unit.bind  # noqa: S104
    key_file, key_var = unit_key(recipe, spec, unit)
    topology = recipe.topologies[spec.topology]
    falls_back = unit.kind == "gateway" and topology.router is not None and topology.router.fallback is not None
    backend = f"http://{LOOPBACK}:{topology.ports.router_backend}" if falls_back else None
    ask: SmokeAsk = {
        "served_name": recipe.model.served_name,
        "prompt": recipe.smoke.prompt,
        "expect": recipe.smoke.expect,
        "timeout_s": recipe.smoke.timeout_s,
        "max_tokens": smoke_budget(recipe.smoke.max_tokens, recipe.topologies[spec.topology].max_model_len),
        "key_file": key_file,
        "key_var": key_var,
    }
    if verify_cache:
        ask["verify_cache"] = verify_cache
    if tool:
        ask["tool"] = {"prompt": tool.prompt, "name": tool.name, "result": tool.result}
    if backend:
        # a gateway with a hosted fallback answers /health (and everything) while its router is
        # not up yet: the check waits for the router itself first, so that what answers it is the
        # router and the engines behind it
        ask["backend"] = backend
    return SmokeCheck(url=f"http://{host}:{api}", request=ask)


def _units(
    recipe: Recipe, spec: HostPlan, files: list[RenderedFile], weights: WeightsTarget | None
) -> list[UnitTarget]:
    """Each unit in start order, with the digest of the files it reads, its smoke check and ports."""
    units: list[UnitTarget] = []
    for unit in sorted(spec.units, key=lambda u: u.stage):
        mine = [f for f in files if f"/{unit.name}." in f.path or f.path in unit.files or f.path in unit.secret_files]
        ports = {port: f"{unit.name} {label}" for label, port in unit.every_port().items()}
        secrets = {f.path: f.sha256 for f in mine if f.secret}
        engine = unit.kind == "engine" and weights is not None
        smoke = _smoke(recipe, spec, unit, weights)
        others = tuple(sorted(f.path for f in mine if not f.secret))
        units.append(
            UnitTarget(unit.name, digest(mine), smoke, ports, unit.stage, secrets, reads_weights=engine, files=others)
        )
    return units


def _pins(recipe: Recipe, spec: HostPlan, checkpoints: tuple[WeightsTarget, ...]) -> dict[str, str]:
    """The recipe pins that make a converge come back to this host's release."""
    pins = {f"engines.{spec.engine}.version": spec.engine_version}
    if spec.role == "router":
        pins = {f"routers.{spec.engine}.version": spec.engine_version}
        extra = recipe.routers[spec.engine].packages  # type: ignore[index]
        pins |= {f"routers.{spec.engine}.packages.{k}": v for k, v in sorted(extra.items())}
    else:
        engine_release = recipe.engines[spec.engine]  # type: ignore[index]
        pins |= {f"engines.{spec.engine}.packages.{k}": v for k, v in sorted(engine_release.packages.items())}
        if engine_release.package is not None:
            pins[f"engines.{spec.engine}.package"] = engine_release.package
    pins |= {f"{c.field}.revision": c.revision for c in checkpoints}
    return pins


# The watchdog starts after every other unit of its host (kimi_pyinfra.start_order.STAGES).
WATCHDOG_STAGE = 4
# It runs with the host's own Python (a stdlib program, like the probe).
HOST_PYTHON = "/usr/bin/python3"


def _watchdog(
    recipe: Recipe, spec: HostPlan, units: list[UnitTarget], weights: WeightsTarget | None
) -> list[RenderedFile]:
    """The watchdog's files on a host that runs engines (none without ``recipe.watchdog``)."""
    engines = [u for u in spec.units if u.kind == "engine"]
    if recipe.watchdog is None or not engines:
        return []
    smoke = {u.name: u.smoke for u in units}
    plain: UnitAsk = {
        "served_name": recipe.model.served_name,
        "prompt": recipe.smoke.prompt,
        "expect": recipe.smoke.expect,
        "max_tokens": 1,
        "key_file": None,
        "key_var": None,
    }
    checks = [
        (u.name, check.url, check.request) if (check := smoke.get(u.name)) else (u.name, None, plain) for u in engines
    ]
    scrub = f"{weights.path}/.kimi/scrub.json" if weights is not None and recipe.weights.scrub is not None else None
    config = watchdog_config(recipe, recipe.watchdog, spec, checks, scrub)
    return watchdog_files(
        recipe.watchdog, config, config_dir=recipe.paths.config, tools_dir=recipe.paths.tools, python=HOST_PYTHON
    )


def _watchdog_target(files: list[RenderedFile]) -> UnitTarget:
    mine = [f for f in files if f"/{WATCHDOG_UNIT}." in f.path]
    return UnitTarget(WATCHDOG_UNIT, digest(mine), None, {}, WATCHDOG_STAGE, files=tuple(f.path for f in mine))


def _release(
    deploy: DeployPlan,
    venvs: list[VenvRelease],
    checkpoints: tuple[WeightsTarget, ...],
    files: list[RenderedFile],
    units: list[UnitTarget],
) -> Release:
    """The host's release: named by a digest of what it runs, with what a rollback to it needs
    besides its id: the files to put back (never a secret), the start order, the smoke checks,
    and the recipe pins."""
    recipe, spec = deploy.recipe, deploy.spec
    identity: ReleaseIdentity = {
        # 2: the release folder holds what a rollback needs (files, stages, batch, smoke checks, pins)
        "format": 2,
        "topology": spec.topology,
        "pool": spec.pool,
        "role": spec.node_role,
        "engine": spec.engine,
        "engine_version": spec.engine_version,
        "model": recipe.model.repo,
        "revision": recipe.model.revision if checkpoints else None,
        "units": {u.name: u.release for u in units},
    }
    release_id = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    record: ReleaseRecord = {
        **identity,
        "files": sorted(f.path for f in files if not f.secret),
        "stages": {u.name: u.stage for u in units},
        # the batch its units (re)start in, which a rollback to this release keeps
        "batch": batch_of(spec, deploy.topology),
        "smoke": {u.name: {"url": u.smoke.url, "request": u.smoke.request} for u in units if u.smoke},
        "pins": _pins(recipe, spec, checkpoints),
        # every checkpoint it serves, by its link in the release folder: the probe reads each
        # one's revision history and whether a rollback finds it whole
        "checkpoints": {c.link: {"repo": c.repo, "revision": c.revision} for c in checkpoints},
    }
    links = {"engine": venvs[0].path} | {c.link: c.path for c in checkpoints}
    folder = f"{recipe.paths.releases}/{release_id}"
    kept = [
        RenderedFile(f"{folder}/release.json", json.dumps(record, sort_keys=True) + "\n", 0o644, "root"),
        # ``cp --parents`` as root: the copy takes the file's mode less the umask's 022
        *(
            RenderedFile(f"{folder}/files{f.path}", f.content, f.mode & ~0o022, "root", withheld=f.withheld)
            for f in files
            if not f.secret
        ),
    ]
    return Release(recipe.paths.current, folder, record, links, kept)


def plan_converge(deploy: DeployPlan, environ: Mapping[str, str], *, plan_only: bool = False) -> Converge:
    """What the converge makes true on ``deploy``'s host; ``environ``: the controller's environment.

    ``plan_only``, for ``kimi-deploy plan``, which writes no host: no secret is read (each secret
    file keeps its path, owner and mode, its content ``WITHHELD``: the units' digests and the
    release are the converge's), and a checkpoint without its lock leaves the file holding the
    scrub's request ``withheld`` instead of refusing."""
    recipe, spec = deploy.recipe, deploy.spec
    venvs = _releases(recipe, spec, plan_only)
    checkpoints = _checkpoints(deploy, environ, plan_only)
    weights = checkpoints[0] if checkpoints else None
    files = render_host(recipe, spec, _secrets(deploy, environ, plan_only))
    timers: list[str] = []
    if weights is not None and recipe.weights.scrub is not None:
        files += scrub_files(
            recipe.weights.scrub,
            config_dir=recipe.paths.config,
            tools_dir=recipe.paths.tools,
            python=weights.python,
            request=sync_request(weights),
            withheld=weights.withheld,
        )
        timers.append(SCRUB_UNIT)
    units = _units(recipe, spec, files, weights)
    watchdog = _watchdog(recipe, spec, units, weights)
    if watchdog:
        files += watchdog
        units = [*units, _watchdog_target(files)]
    topology = recipe.topologies[spec.topology]
    gateway = any(u.kind == "gateway" for u in spec.units)
    master = any(u.kind == "mooncake-master" for u in spec.units)
    # the Mooncake store client, imported by an engine whose KV cache goes through the store
    client = spec.role != "router" and topology.mooncake_store
    # NIXL, imported by an engine whose KV cache moves with NixlConnector
    nixl = (
        spec.role != "router"
        and topology.kv_transfer is not None
        and "NixlConnector" in topology.kv_transfer.connectors
    )
    libraries = (
        (MOONCAKE_MASTER if master else ()) + (MOONCAKE_CLIENT if client else ()) + (NIXL_CLIENT if nixl else ())
    )
    debs = [
        *(GATEWAY_PACKAGES if gateway else ()),
        *library_packages(libraries, recipe.host_os(spec.topology)),
        *engine(topology.engine).host_packages(topology),
        *(GUARD_PACKAGES if any(u.guard for u in spec.units) else ()),
    ]
    return Converge(
        user=recipe.paths.user,
        index_url=deploy.host.vars.kimi_pip_index_url or PYPI,
        venvs=venvs,
        checkpoints=checkpoints,
        files=files,
        units=units,
        release=_release(deploy, venvs, checkpoints, files, units),
        timers=timers,
        packages=list(dict.fromkeys(debs)),
        masked=list(GATEWAY_MASKED) if gateway else [],
        router_api=drain_api(recipe, spec, deploy.topology),
    )


def converge_request(todo: Converge) -> StateRequest:
    """What the host probe must read for this converge."""
    files = todo.files + todo.release.files + ([todo.weights.token] if todo.weights and todo.weights.token else [])
    request: StateRequest = {
        "user": todo.user,
        "venvs": [v.path for v in todo.venvs],
        "weights": [{"dir": c.path, "lock": c.lock} for c in todo.checkpoints],
        "files": [f.path for f in files],
        "units": [u.name for u in todo.units],
        "unit_secrets": {u.name: sorted(u.secrets) for u in todo.units if u.secrets},
        "unit_files": {u.name: list(u.files) for u in todo.units if u.files},
        "timers": todo.timers,
        "models": [c.path.rsplit("/", 1)[0] for c in todo.checkpoints],
        "ports": sorted(port for u in todo.units for port in u.ports),
        "link": todo.release.link,
        "packages": todo.packages,
    }
    if todo.router_api:
        request["router"] = True
    return request


def port_conflicts(
    todo: Converge, listeners: Mapping[str, Listener], restarting: frozenset[str] = frozenset()
) -> list[str]:
    """Planned ports another process already listens on. A unit may hold its own ports, and a
    unit of this host that this converge restarts (``restarting``) may hold a port it hands over:
    units of a stage start in plan order, so it lets go before the new holder starts."""
    out = []
    for unit in todo.units:
        for port, label in sorted(unit.ports.items()):
            holder = listeners.get(str(port))
            if holder and holder.get("unit") != unit.name and holder.get("unit") not in restarting:
                owner = f"unit {holder['unit']}" if holder.get("unit") else "no systemd unit"
                out.append(f"port {port} ({label}) is in use by pid {holder['pid']} ({holder['comm']}, {owner})")
    return out


def preflight_needs(todo: Converge, deploy: DeployPlan, state: HostState) -> Needs:
    """What the preflight gates check this host against: the files of every checkpoint it holds,
    those still missing counting as needed space."""
    missing = total = 0
    for c in todo.checkpoints:
        found = state["weights"].get(c.path)
        present = found is not None and found["exists"]
        absent = set(found["missing"]) | set(found["unverified"]) if found is not None and present else set(c.lock)
        missing += sum(int(c.lock[p][0]) for p in absent if p in c.lock)
        total += sum(int(size) for size, _ in c.lock.values())
    return Needs(deploy.recipe, deploy.spec, total, missing, list(deploy.host.vars.kimi_rdma_devices or []))
