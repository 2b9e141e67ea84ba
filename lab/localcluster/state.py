"""Where a local cluster lives and what it is: settings from the environment and ``state.json``.

``state.json`` is the one interface other tools read; it is always replaced whole (write, fsync,
rename), so a reader never sees half of it. Its shape (version 1)::

    {"version": 1, "bridge": "kimibr0", "subnet": "10.213.7.0/24", "gateway": "10.213.7.1",
     "ssh_key": ".../id_ed25519", "known_hosts": ".../known_hosts",
     "hosts": [{"name": "kimi-h1", "address": "10.213.7.11", "pid": 1234,
                "root": ".../hosts/kimi-h1/merged", "hardware": "b300x8", "state": "running"}],
     "services": {"hub": {"url": "http://10.213.7.1:8765", "pid": 2345},
                  "index": {"url": "http://10.213.7.1:8766/simple", "pid": 2346},
                  "apt": {"url": "http://10.213.7.1:8767/compute/cuda/repos", "pid": 2347}},
     "drill_faults": {"engine-garbage": {"inject": CMD, "clear": CMD}, ...}}

A host's ``pid`` is its boot loop (``localcluster.bootloop``), which outlives the host's reboots.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from localcluster.fault_knobs import FAULT_KNOBS

STATE_VERSION = 1
DEFAULT_DIR = "/var/lib/kimi-cluster"
DEFAULT_CACHE = "/var/cache/kimi-cluster"
DEFAULT_SUBNET = "10.213.7.0/24"
DEFAULT_BRIDGE = "kimibr0"
# Host N gets the address network + FIRST_HOST_OFFSET + N: 10.213.7.11 is kimi-h1.
FIRST_HOST_OFFSET = 10
MAX_HOSTS = 64

HostState = Literal["creating", "starting", "running", "stopped"]


class ClusterError(Exception):
    """A failure reported to the user as one line naming what failed and where; the CLI exits 2.

    ``detail`` (say, the last lines of a log) is printed below that line, as it is.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(" ".join(message.split()))
        self.detail = detail


def _safe_path(value: str, what: str) -> Path:
    # Paths end up in overlayfs mount options, where ',' and ':' are separators.
    if not value.startswith("/") or re.search(r"[\s,:]", value):
        raise ClusterError(f"{what}={value!r}: must be an absolute path without spaces, ',' or ':'")
    return Path(value)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Names and paths of one cluster, all derived from its state directory and subnet."""

    state_dir: Path
    cache_dir: Path
    subnet: ipaddress.IPv4Network

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        raw_subnet = env.get("KIMI_CLUSTER_SUBNET", DEFAULT_SUBNET)
        try:
            subnet = ipaddress.IPv4Network(raw_subnet, strict=True)
        except ValueError as exc:
            raise ClusterError(f"KIMI_CLUSTER_SUBNET={raw_subnet!r}: {exc}") from exc
        if subnet.prefixlen > 24:
            raise ClusterError(f"KIMI_CLUSTER_SUBNET={raw_subnet!r}: needs a /24 or larger network")
        return cls(
            state_dir=_safe_path(env.get("KIMI_CLUSTER_DIR", DEFAULT_DIR), "KIMI_CLUSTER_DIR"),
            cache_dir=_safe_path(env.get("KIMI_CLUSTER_CACHE", DEFAULT_CACHE), "KIMI_CLUSTER_CACHE"),
            subnet=subnet,
        )

    @property
    def _net_hex(self) -> str:
        return f"{int(self.subnet.network_address):08x}"

    @property
    def is_default(self) -> bool:
        return str(self.subnet) == DEFAULT_SUBNET

    @property
    def bridge(self) -> str:
        # Interface names hold at most 15 characters; the network address makes the name unique.
        return DEFAULT_BRIDGE if self.is_default else f"kimibr-{self._net_hex}"

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def ssh_key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    def host_name(self, index: int) -> str:
        return f"kimi-h{index}"

    def host_address(self, index: int) -> str:
        return str(self.subnet.network_address + FIRST_HOST_OFFSET + index)

    def host_dir(self, name: str) -> Path:
        return self.state_dir / "hosts" / name

    def netns(self, name: str) -> str:
        # Two clusters (the default one and a test's) both have a kimi-h1: suffix all but the default.
        return name if self.is_default else f"{name}-{self._net_hex}"

    def veth(self, address: str) -> str:
        # Named after the host's address, which is unique on this machine while subnets do not overlap.
        return f"kv{int(ipaddress.IPv4Address(address)):08x}"

    def cgroup(self, name: str) -> str:
        """The cgroup path (relative to each hierarchy's root) that host ``name``'s launcher runs in."""
        return f"kimi-cluster/{self.bridge}/{name}"


@dataclasses.dataclass
class HostRecord:
    name: str
    address: str
    pid: int | None
    root: str
    hardware: str
    state: HostState


@dataclasses.dataclass
class ServiceRecord:
    url: str
    pid: int
    # what its content was built from when it started (``localcluster.services.checkout_stamp``)
    content: str = ""


@dataclasses.dataclass
class ClusterState:
    bridge: str
    subnet: str
    gateway: str
    ssh_key: str
    known_hosts: str
    hosts: list[HostRecord]
    services: dict[str, ServiceRecord]

    @classmethod
    def empty(cls, settings: Settings) -> ClusterState:
        return cls(
            bridge=settings.bridge,
            subnet=str(settings.subnet),
            gateway=settings.gateway,
            ssh_key=str(settings.ssh_key),
            known_hosts=str(settings.known_hosts),
            hosts=[],
            services={},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "bridge": self.bridge,
            "subnet": self.subnet,
            "gateway": self.gateway,
            "ssh_key": self.ssh_key,
            "known_hosts": self.known_hosts,
            "hosts": [dataclasses.asdict(h) for h in self.hosts],
            "services": {name: dataclasses.asdict(s) for name, s in self.services.items()},
            # what deploys/drill.py injects on its hosts beyond the safe drills (inventories hand it on)
            "drill_faults": FAULT_KNOBS,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> ClusterState:
        if data.get("version") != STATE_VERSION:
            raise ClusterError(f"{where}: version {data.get('version')!r}, this tool reads {STATE_VERSION}")
        try:
            return cls(
                bridge=data["bridge"],
                subnet=data["subnet"],
                gateway=data["gateway"],
                ssh_key=data["ssh_key"],
                known_hosts=data["known_hosts"],
                hosts=[HostRecord(**h) for h in data["hosts"]],
                services={n: ServiceRecord(**s) for n, s in data["services"].items()},
            )
        except (KeyError, TypeError) as exc:
            raise ClusterError(f"{where}: not a cluster state file: {exc}") from exc


def load(settings: Settings) -> ClusterState | None:
    """The recorded cluster, or None when this state directory holds none."""
    path = settings.state_file
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClusterError(f"{path}: not JSON: {exc}") from exc
    state = ClusterState.from_json(data, path)
    if state.subnet != str(settings.subnet):
        raise ClusterError(
            f"{path}: records a cluster on {state.subnet}, KIMI_CLUSTER_SUBNET asks for {settings.subnet}: "
            "run `down` with the recorded subnet first"
        )
    return state


def save(settings: Settings, state: ClusterState) -> None:
    write_atomic(settings.state_file, json.dumps(state.to_json(), indent=2) + "\n")


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` whole: readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(settings: Settings) -> Iterator[None]:
    """Serialise ``up`` and ``down`` on one state directory (two test runs, two terminals)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(settings.state_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
