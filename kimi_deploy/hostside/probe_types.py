"""The probes' answers (``hostside/state_probe.py``, ``hostside/driver_probe.py``,
``hostside/hardware_probe.py``), as types the host programs and the controller share: a probe
builds its answer, its fact (``facts.host_state.KimiHostState``, ``facts.drivers.DriversState``,
``facts.hardware.HostHardware`` through ``parse_profile``) reads it, and the converge decides on
it. ``tests/test_probe_contract.py`` runs each probe for real and holds its answer to these types,
key for key.
"""

# Evaluated as written (no ``from __future__ import annotations``): Python 3.11's TypedDict reads
# NotRequired only from an evaluated annotation.
from typing import Any, NotRequired, TypedDict


class Damage(TypedDict):
    """A release's files missing or of another size since install."""

    count: int
    first: list[str]
    lock_intact: bool


class ReleaseMarker(TypedDict, total=False):
    """``.kimi-release.json`` of an installed release (``hostside/venv_install.py`` writes it;
    an older release's has fewer keys), with the probe's ``damaged`` verdict."""

    package: str
    version: str
    requirements: list[str]
    index_url: str
    without: list[str]
    # the lock's sha256, the platform it was resolved on and its number of packages
    lock: dict[str, Any]
    uv: str
    manifest: str
    damaged: Damage | None


class WeightsFound(TypedDict):
    """A revision's folder checked against its lock and the verification cache (stats only)."""

    exists: bool
    missing: list[str]
    unverified: list[str]
    # of ``unverified``: the files the engine user cannot read (their mode, or a folder's)
    unreadable: list[str]
    extra: list[str]


class UnitState(TypedDict):
    """A unit as systemd and the deploy's applied marker know it."""

    active: str
    sub: str
    # when it entered its ``active`` state, by the host's clock (seconds since the epoch), None:
    # systemd has no time for it
    since: float | None
    pid: int
    enabled: str
    # the digest of the release the deploy last (re)started it with, None: never
    applied: str | None
    # a secret file it reads was written after that start
    secrets_changed: bool
    # its unit file or another file it reads was written after that start (or systemd has not
    # loaded its unit file since it changed): what runs is not what the files say
    files_changed: bool
    # systemd has not loaded its unit file since the file changed (a restart reloads first)
    needs_reload: bool
    # systemd's restarts of it, and those a smoke test found serving since
    restarts: int
    restarts_verified: int
    # a smoke test found it serving since the deploy last (re)started it (False: never checked,
    # or still starting after a converge that stopped before its smoke test)
    verified: bool
    # how long it was without service before that smoke test found it answering (its last stop or
    # restart to the answer), None: unknown (a first start, or not verified)
    down_s: float | None
    # the context length hostside/ladder.py last started it with (None: none, or started since)
    context: int | None
    # never from the probe: set by the converge (``kimi_deploy.converge.plan.unit_state``) when the
    # weights an engine reads are repaired by this converge
    weights_changed: NotRequired[bool]


class TimerState(TypedDict):
    active: str
    enabled: str


class Listener(TypedDict):
    """Who listens on a port: its pid, command and systemd unit ("" when none)."""

    pid: int
    comm: str
    unit: str


class Revisions(TypedDict):
    """The revision folders of a model, and the revisions the release log served, oldest first."""

    present: list[str]
    history: list[str]


class ReleaseEntry(TypedDict):
    """A release named by the release log: its record, and whether what it links to is whole."""

    record: dict[str, Any]
    engine: bool
    # every checkpoint it links (the model, a draft) still verified; None: it links none
    model: bool | None
    files: bool
    # the serving benchmark's figures kept in its folder (``bench.json``: ``{"release", "at",
    # "figures"}``), unchecked: read through ``kimi_deploy.serving.status_table``; None: none
    bench: dict[str, Any] | None
    # the cold start of the converge that left it serving (``cold-start.json``: ``{"release", "at",
    # "run", "seconds": {phase: s}, "to_serving"}``), unchecked: read through
    # ``kimi_deploy.serving.status_table``; None: none
    cold_start: dict[str, Any] | None


class Releases(TypedDict):
    """The release log's entries ([time, release dir, outcome, run id]) and every release it names."""

    entries: list[list[str]]
    records: dict[str, ReleaseEntry | None]


class LadderProof(TypedDict):
    """A rung of the context ladder as hostside/ladder.py recorded it (the key of the engine
    release, hardware and topology it was climbed with)."""

    key: Any
    unit: Any
    rung: Any
    passed: Any


class CurrentFile(TypedDict):
    """A file the host holds whose content is not the one a converge writes (``hostside/changed_files.py``,
    asked by a run that shows its diff): its size, and its text or why it is not shown."""

    size: int
    # its content, None when not shown
    text: str | None
    # why not shown: "binary", "large" (over the bound of one file), "total" (over the bound of
    # the answer), "not a file", "unreadable"; "" when shown
    why: str


class StateAnswer(TypedDict):
    """What ``hostside/state_probe.py`` prints."""

    user: bool
    venvs: dict[str, ReleaseMarker | None]
    # by revision folder: each checkpoint the host holds (the model, a speculative draft)
    weights: dict[str, WeightsFound]
    # sha256, None: absent
    files: dict[str, str | None]
    # "owner:group:octal mode" of each of ``files``, None: absent
    owners: dict[str, str | None]
    units: dict[str, UnitState]
    timers: dict[str, TimerState]
    # by the folder of a checkpoint's revisions
    revisions: dict[str, Revisions]
    # by port, as a string
    listeners: dict[str, Listener]
    # installed or not, by Debian package
    packages: dict[str, bool]
    # where the ``current`` link points, None: no link
    current: str | None
    # [time, release dir, outcome] of the release log's last entry
    last_release: list[str] | None
    # with ``releases`` in the request (a rollback)
    releases: Releases | None
    # the context ladder's proofs, as the host recorded them (unchecked: read through
    # ``kimi_deploy.serving.context_ladder.proven``)
    ladder: list[LadderProof]
    # the watchdog's state file, as the host holds it (unchecked: read through
    # ``kimi_deploy.serving.watchdog_report``), None without one
    watchdog: dict[str, Any] | None
    # what its releases are built for (unchecked: read through
    # ``kimi_deploy.releases.lock.HostPlatform.parse``)
    platform: dict[str, str]
    # the engines a drain took out of this host's router and did not put back (asked of a router
    # that drains: ``kimi_deploy.serving.router_drain``; else empty)
    router_drained: list[str]
    # with ``diff`` in the request: each of its files that differs, None: absent (unchecked: read
    # through ``kimi_deploy.converge.file_diff``)
    contents: NotRequired[dict[str, CurrentFile | None]]
    # with ``compile_caches`` in the request: each one's artifact and the engine's copy, by the
    # artifact's folder (unchecked: ``hostside.compile_cache_found``, read through
    # ``kimi_deploy.converge.compile_caches``)
    compile_caches: NotRequired[dict[str, Any]]


class OsRelease(TypedDict):
    id: str | None
    version_id: str | None
    pretty: str | None
    # dpkg's architecture, None: no dpkg
    arch: str | None


class InstalledPackage(TypedDict):
    version: str
    held: bool


class Nvml(TypedDict, total=False):
    """The driver NVML runs (``nvidia-smi``), or why it could not say."""

    version: str
    error: str


class ServiceState(TypedDict):
    # systemd's ActiveState ("unknown" when systemd did not answer), UnitFileState ("": no such unit)
    active: str
    enabled: str


class SecureBoot(TypedDict):
    """UEFI Secure Boot and the DKMS signing keys: what decides whether a module DKMS builds loads."""

    # None: the firmware's variable could not be read
    enabled: bool | None
    # asked key -> "enrolled" | "not enrolled" | "missing" | "unknown: <why>" (only when enabled)
    keys: dict[str, str]


class DriversAnswer(TypedDict):
    """What ``hostside/driver_probe.py`` prints (unless it prints ``{"error": ...}``)."""

    os: OsRelease
    kernel: str
    # the running kernel's build tree (what DKMS needs) is there
    headers: bool
    # installed NVIDIA and CUDA packages
    packages: dict[str, InstalledPackage]
    # the lines of the cuda-* apt sources
    sources: list[str]
    # the loaded kernel module's version
    module: str | None
    # None: nvidia-smi not asked or absent
    nvml: Nvml | None
    # packages asking for a reboot, None: no reboot asked for
    reboot_required: list[str] | None
    services: dict[str, ServiceState]
    files: dict[str, str | None]
    # "owner:group:octal mode" of each of ``files``, None: absent
    owners: dict[str, str | None]
    sysctl: dict[str, str | None]
    boot_id: str
    # None: not asked
    secure_boot: NotRequired[SecureBoot | None]


class SectionError(TypedDict):
    """A section of the hardware probe that failed: what broke (the probe carries on)."""

    error: str


class CommandRun(TypedDict):
    """A command the hardware probe ran, raw: ``rc`` None when it did not run or timed out."""

    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    error: str | None


class PciDevice(TypedDict):
    address: str
    vendor: str
    device: str


class PciGpus(TypedDict):
    devices: list[dict[str, str]]


class NvidiaSection(TypedDict):
    # NVML's answer as the driver gives it (devices, fabric, errors per field), or its error;
    # None: not tried (no pynvml)
    nvml: dict[str, Any] | SectionError | None
    smi_query: CommandRun | None
    smi_topo: CommandRun | None
    smi_fields: list[str]
    pci_gpus: PciGpus | SectionError


class TpuSection(TypedDict):
    pci: list[PciDevice]
    nodes: list[str]
    # the GCE metadata's accelerator type and worker number, or its error; None: no Google
    # accelerator on PCI
    metadata: dict[str, str | None] | None


class RdmaPort(TypedDict):
    device: str
    port: str
    state: str | None
    phys_state: str | None
    rate: str | None
    link_layer: str | None


class RdmaSection(TypedDict):
    ports: list[RdmaPort]


class HostSection(TypedDict):
    meminfo: dict[str, str]
    numa_nodes: int
    cpu_model: str | None
    cpu_count: int | None
    os_release: dict[str, str | None]
    kernel: str
    python: str


class DiskRead(TypedDict):
    bytes: int
    seconds: float
    # "existing": the folder's largest file, "temp": a file written for the measure
    source: str
    file: str | None


class DiskSection(TypedDict):
    requested: str
    path: str
    mount_point: str | None
    fs_type: str | None
    total_bytes: int
    free_bytes: int
    read: DiskRead | SectionError | None


class DriversSection(TypedDict):
    proc_version: str | None
    dpkg: CommandRun | None
    services: CommandRun | None


class HardwareAnswer(TypedDict):
    """What ``hostside/hardware_probe.py`` prints: raw values for ``parse_profile``."""

    schema: int
    nvidia: NvidiaSection
    tpu: TpuSection | SectionError
    rdma: RdmaSection | SectionError
    host: HostSection | SectionError
    disk: DiskSection | SectionError
    drivers: DriversSection
    elapsed_s: float
