"""The requests the controller sends its host programs, as types both sides read.

The controller's plans build them (``kimi_deploy.converge.plan``, ``commcheck_plan``, ``allreduce_plan``,
``router_view_plan``, ``router_drain_plan``) and ``kimi_deploy.host.programs`` sends them; a host
program reads its own with ``kimi_deploy.hostside.request.read_request`` and names its type for the
type checker only (under ``if TYPE_CHECKING:``): a host imports no ``typing`` at run time, and this
module never travels in a bundle. A request comes from the controller's own recipe and plan, not
from outside: the host trusts its shape as it trusts the program's code.
"""

from __future__ import annotations

from typing import Any, NotRequired, Required, TypedDict

# A revision's lock as the weights sync reads it: file name -> [sha256, size] (``kimi_deploy.weights.lockfile``).
Lock = dict[str, list[Any]]


class PeerSource(TypedDict):
    """Where a host copies the revision's files from before the Hub: a local mirror's folder
    (``path``) or a host of the run serving them (``url``, ``weights_fanout``)."""

    host: str
    url: NotRequired[str]
    path: NotRequired[str]


class SyncRequest(TypedDict):
    """``weights_sync.py``: one checkpoint's revision into ``dir``, verified against ``lock``."""

    repo: str
    revision: str
    dir: str
    lock: Lock
    endpoint: str | None
    token_file: str | None
    retries: int
    progress_log: str
    # a converge's: re-hash every file; the peers in turn (none: the Hub) and the transfer key's file;
    # fetch one file at a time, in order, while other hosts fetch from this one
    full: NotRequired[bool]
    peers: NotRequired[list[PeerSource]]
    peer_key_file: NotRequired[str | None]
    in_order: NotRequired[bool]
    # False: what no peer gives fails the sync (a compile cache, which no Hub holds)
    hub: NotRequired[bool]
    # the scrub's: every file re-hashed, repaired or only reported
    scrub: NotRequired[bool]
    repair: NotRequired[bool]
    workers: NotRequired[int]
    # the Hub's weather (``hub_fetch.Weather``): attempts, backoff, waiting budget, the slowest
    # rate and a file's floor, and the whole sync's deadline (bench/ and the tests shorten them)
    hub_attempts: NotRequired[int]
    hub_backoff_s: NotRequired[float]
    hub_wait_budget_s: NotRequired[float]
    min_bytes_per_s: NotRequired[float]
    file_floor_s: NotRequired[float]
    hub_deadline_s: NotRequired[float]


class SmokeTool(TypedDict):
    """The recipe's ``smoke.tool_call``: a function the engine must call, and what it returns."""

    prompt: str
    name: str
    result: str


class UnitAsk(TypedDict):
    """What a unit's API is asked (the smoke test's, the watchdog's canary): the served name, the
    prompt and the word the answer holds, and the API key's file and variable."""

    served_name: str
    prompt: str
    expect: str
    max_tokens: int
    key_file: str | None
    key_var: str | None


class SmokeAsk(UnitAsk):
    """What a unit's smoke test asks its API (``converge.smoke_check``), the same on every run."""

    timeout_s: float
    verify_cache: NotRequired[str]
    tool: NotRequired[SmokeTool]
    backend: NotRequired[str]


class SmokeRequest(SmokeAsk):
    """``smoke.py``: ``SmokeAsk`` of ``unit`` at ``url``, and where it records the restarts it saw."""

    unit: str
    url: str
    restarts: int
    restarts_file: str


class SmokePlan(TypedDict):
    """A unit's smoke test in a converge's batch (``kimi_pyinfra.operations.serving.verified``)."""

    unit: str
    url: str
    request: SmokeAsk
    # this run (re)starts it, or systemd restarted it since it was last checked
    restarted: bool
    # systemd's restarts of it already seen
    restarts: int
    # the pool (``TOPOLOGY/POOL``) of which it is the only instance's API, else None
    only: str | None


class RouterViewRequest(TypedDict):
    """``router_view.py``: wait until the router sends to ``workers`` again."""

    router: str
    metrics: str
    gauge: str
    # the router's circuit-breaker gauge, and how long an open circuit waits before a trial
    # (without: the wait reads the health gauge alone)
    circuit: NotRequired[str]
    circuit_open_s: NotRequired[float]
    workers: list[str]
    timeout_s: float


class DrainRequest(TypedDict):
    """``router_drain.py``: take ``workers`` out of the router (``out``) or put them back (``in``)."""

    router: str
    # the router's API on the host (``router_drain_plan.drain_api``)
    api: str
    phase: str
    workers: list[str]
    timeout_s: float
    drained_file: NotRequired[str]


class ProbePort(TypedDict):
    """A port one host of a communication check reaches on another, labelled for the report."""

    port: int
    label: str


class CommPeer(TypedDict):
    host: str
    address: str
    ports: list[ProbePort]


class Bandwidth(TypedDict):
    bytes: int
    min_mbit_s: float
    max_s: float


class CommCheckRequest(TypedDict):
    """``commcheck.py``: the topology's hosts reach each other's ports, at ``bandwidth``."""

    run: str
    me: str
    address: str
    port: int
    listen: list[ProbePort]
    peers: list[CommPeer]
    bandwidth: Bandwidth
    deadline_s: float
    # the ports above the listener's that it may take when its own is busy
    ephemeral: int


class CommCheckPhase(CommCheckRequest):
    """``commcheck.py`` in one of its steps (``listen``, ``probe``, ``verdict``)."""

    phase: str


class CommCheckListen(CommCheckPhase):
    """Its ``listen`` step: how long the listener may live."""

    lifetime_s: float


class Rendezvous(TypedDict):
    address: str
    port: int


class AllReduceHost(TypedDict):
    host: str
    address: str
    ranks: int


class AllReduceRequest(TypedDict):
    """``allreduce.py``: one instance's hosts run one all-reduce, its bus bandwidth judged."""

    run: str
    label: str
    me: str
    address: str
    backend: str
    rendezvous: Rendezvous
    hosts: list[AllReduceHost]
    min_bytes: int
    max_bytes: int
    warmup_iters: int
    iters: int
    deadline_s: float
    min_busbw_gbs: float
    env: dict[str, str]


class WatchedAccelerators(TypedDict):
    vendor: str
    count: int


class WatchedDevices(TypedDict):
    """The devices the watchdog reads the health of (``AcceleratorKind.watchdog``), and the
    kernel's log it reads their faults from; None where the kind has no reader."""

    accelerators: WatchedAccelerators | None
    kmsg: str | None


class WatchedUnit(UnitAsk):
    unit: str
    url: str | None
    reads_weights: bool


class WatchdogConfig(WatchedDevices):
    """``watchdog.py``'s config file (``kimi_deploy.render.watchdog_units.watchdog_config``)."""

    interval_s: float
    timeout_s: float
    canary_interval_s: float
    canary_timeout_s: float
    restart_after: int
    restarts: int
    grace_s: float
    state: str
    textfile: str
    units: list[WatchedUnit]
    scrub: str | None
    xid_ignore: list[int]


class DriversRequest(TypedDict, total=False):
    """``driver_probe.py``: what the drivers step reads of an engine host (nothing of a kind with
    no drivers step): NVIDIA's packages and module, these services' states, these files (their
    content's digest and owner), the Secure Boot keys DKMS signs with, these kernel settings."""

    nvidia: bool
    services: list[str]
    files: list[str]
    secure_boot: list[str]
    sysctl: list[str]
    timeout_s: float


class WeightsAsked(TypedDict):
    dir: str
    lock: Lock


class CompileCacheAsked(TypedDict):
    """A compile cache the state probe reads: the artifact of its key and the engine's folder."""

    dir: str
    engine_dir: str


class StateRequest(TypedDict, total=False):
    """``state_probe.py`` (in the host probe's round-trip): what a converge decides on (a
    rollback asks the user, the link and the release records alone)."""

    user: Required[str]
    venvs: list[str]
    weights: list[WeightsAsked]
    files: list[str]
    units: list[str]
    unit_secrets: dict[str, list[str]]
    unit_files: dict[str, list[str]]
    timers: list[str]
    models: list[str]
    ports: list[int]
    link: str
    packages: list[str]
    # a router host whose router drains: the engines a drain left out are read too
    router: bool
    # a rollback's: the release records kept on the host
    releases: bool
    # a run that shows its diff (pyinfra's ``--diff``): the sha256 of each file, not a secret, the
    # converge writes, by path; the answer's ``contents`` holds those that differ
    diff: dict[str, str]
    # each engine unit's compile cache: its artifact and the engine's copy (``compile_cache_found``)
    compile_caches: list[CompileCacheAsked]


class RungFile(TypedDict):
    """A file of the climbing unit as it is at one rung (its unit file, its command line)."""

    path: str
    content: str
    mode: int


class Rung(TypedDict):
    rung: int
    release: str
    files: list[RungFile]
    max_tokens: int


class ContextProbeAsk(TypedDict):
    """The recipe's ``context_probe``: a needle in a prompt filling ``fill`` of the rung."""

    needle: str
    question: str
    expect: str
    fill: float
    depth: float
    max_tokens: int
    timeout_s: float


class ProofKey(TypedDict):
    """What a rung's proof holds for (``context_ladder.proof_key``) and how it reads."""

    key: str
    topology: str
    engine: str
    hardware: str


class LadderSmoke(SmokeAsk):
    unit: str
    url: str


class LadderRequest(TypedDict):
    """``ladder.py``: the engine ``unit`` started at each rung in turn, probed, recorded."""

    unit: str
    rungs: list[Rung]
    back: Rung | None
    smoke: LadderSmoke
    probe: ContextProbeAsk
    proof: ProofKey
    release_dir: str
    run: str
    # the engine's gauges of KV cache use (``Engine.kv_usage_metrics``)
    kv_metrics: list[str]


class ReleaseIdentity(TypedDict):
    """What names a host's release (its folder is a digest of this): the part of the plan it runs."""

    format: int
    topology: str
    pool: str
    role: str
    engine: str
    engine_version: str
    model: str
    revision: str | None
    units: dict[str, str]


class KeptSmoke(TypedDict):
    url: str
    request: SmokeAsk


class Checkpoint(TypedDict):
    repo: str
    revision: str


class ReleaseRecord(ReleaseIdentity):
    """``release.json`` in the release's folder (``converge._release``): what a rollback to it
    needs besides its id. Written by the controller; read back by the host probe
    (``state_probe.py``) and, as a host's text, by the rollback (``kimi_deploy.converge.rollback``)."""

    files: list[str]
    stages: dict[str, int]
    batch: int
    smoke: dict[str, KeptSmoke]
    pins: dict[str, str]
    checkpoints: dict[str, Checkpoint]


class HardwareRequest(TypedDict, total=False):
    """``hardware_probe.py``: where the weights go (their filesystem, and a bounded read measured
    there with ``measure``), NVML and ``nvidia-smi topo -m`` asked or not, the GCE metadata's URL,
    the root it reads under (tests), and each command's bound."""

    weights_dir: str
    measure: bool
    nvml: bool
    topology: bool
    metadata_url: str
    root: str
    timeout_s: float


class HostProbeRequest(TypedDict):
    """``host_probe.py``: the state probe's request, and the hardware and drivers probes' where a
    converge reads them in the same round-trip."""

    state: StateRequest
    hardware: NotRequired[HardwareRequest]
    drivers: NotRequired[DriversRequest]


class UvRelease(TypedDict):
    version: str
    dir: str


class ReleaseLockGiven(TypedDict, total=False):
    """The lock a release installs from: its own kept one (``own``: its digest) or the controller's
    text."""

    own: str
    text: str


class VenvInstallRequest(TypedDict):
    """``venv_install.py``: one release's virtual environment at ``path``, from its lock."""

    path: str
    requirements: list[str]
    index_url: str
    # what ``.kimi-release.json`` records (``ReleaseMarker``'s first keys)
    marker: dict[str, str | list[str]]
    uv: UvRelease
    lock: NotRequired[ReleaseLockGiven | None]


class PeerRequest(TypedDict):
    """``weights_peer.py``: serve the revision's files in ``dir`` to ``allow`` with the run's key."""

    dir: str
    lock: Lock
    bind: str
    port: int
    allow: list[str]
    key_file: str
    fetching: bool
    idle_exit_s: float


class CompileCachePackRequest(TypedDict):
    """``compile_cache_pack.py``: the engine's cache folder packed into the artifact of its key."""

    source: str
    user: str
    dir: str
    most_files: int
    most_bytes: int


class CompileCachePlaceRequest(TypedDict):
    """``compile_cache_place.py``: the artifact of a key placed from the run's peers, verified
    against the controller's ``manifest`` (``{path: [size, digest]}``)."""

    dir: str
    manifest: Lock
    peers: list[PeerSource]
    peer_key_file: str | None
    progress_log: str
    # the engine's copy: its cache folder, the unit's cache folder above it, the engine's user
    engine_dir: str
    owner_root: str
    user: str


class EngineStartAsked(TypedDict):
    """An engine unit's last start, read in its own log (``hostside.start_phases``): per phase, the
    readings to try in turn (``{"took": PATTERN}`` or ``{"between": [A, B]}``), and its ready line."""

    unit: str
    phases: dict[str, list[dict[str, object]]]
    ready: str


class ColdStartRecordRequest(TypedDict):
    """``cold_start_record.py``: a converge's seconds by phase, into the serving release's record."""

    seconds: dict[str, float]
    to_serving: float
    run: str
    current: str
    releases: str
    engines: NotRequired[list[EngineStartAsked]]
