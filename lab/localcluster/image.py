"""The controller's tools and the hosts' shared base images (Debian 12, or Ubuntu 24.04 for hosts
asked for with it; each built once, cached by recipe).

The base is ``<cache>/base-<hash>``, where the hash covers the mmdebstrap command (its package list
and the mirror) and every change made to the result; ``base-<hash>.recipe.json`` next to it records
what was hashed and is written last, so a half-built base is never taken for a finished one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from localcluster import log, run, ubuntu_archive
from localcluster.hardware_spec import DEFAULT_OS, UBUNTU_2404
from localcluster.state import ClusterError, Settings, write_atomic

# command -> Debian package that brings it, for a fresh Debian 12 controller.
CONTROLLER_TOOLS = {
    "systemd-nspawn": "systemd-container",
    "mmdebstrap": "mmdebstrap",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    # The NVIDIA apt repository: packages built and signed here.
    "dpkg-deb": "dpkg",
    "gpg": "gpg",
    "gpg-agent": "gpg-agent",
    "gpgconf": "gpgconf",
}
SUITE = "bookworm"
# The hosts' systems (localcluster.hardware_spec): the default, and Ubuntu for hosts whose hardware
# spec ends in "-ubuntu24.04".
DEBIAN, UBUNTU = DEFAULT_OS, UBUNTU_2404
HOST_OSES = (DEBIAN, UBUNTU)
# Hosts have no internet: whatever the deploy needs on a bare host is baked in here.
INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "iproute2",
    "python3",
    "python3-venv",
    "sudo",
    "procps",
    "ca-certificates",
    "rsync",
    "curl",
    # Firewall rules inside a host (tests: a port blocked between two hosts).
    "nftables",
)
SSHD_CONFIG = """\
# kimi-cluster: root logs in with its key only.
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""
FILES = {
    "etc/ssh/sshd_config.d/kimi-cluster.conf": SSHD_CONFIG,
    # No name server: a lookup goes nowhere but loopback.
    "etc/resolv.conf": "# kimi-cluster hosts have no DNS and no internet\n",
    # apt on a host fails at once instead of waiting on a mirror it cannot reach.
    "etc/apt/sources.list": "# kimi-cluster hosts have no internet; deploys add their own sources\n",
}
# Timers that would wake up on idle test hosts and reach for the network or the disk.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "apt-daily.service",
    "apt-daily-upgrade.service",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
)
BUILD_TIMEOUT_S = 900


# apt on the controller, one user at a time across clusters coming up at once (``apt-get update``
# and ``install`` each take apt's own locks and fail, not wait, when another holds them).
APT_LOCK = Path("/run/lock/kimi-cluster-apt")


def ensure_tools() -> None:
    """Install the controller's packages that are missing (apt-get update once, then install)."""
    with cache_lock(APT_LOCK):
        missing = sorted({pkg for cmd, pkg in CONTROLLER_TOOLS.items() if shutil.which(cmd) is None})
        if not missing:
            return
        if shutil.which("apt-get") is None:
            raise ClusterError(f"controller: needs the Debian packages {', '.join(missing)} and has no apt-get")
        log.info("controller: installing %s", " ".join(missing))
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-q"], env=env, timeout=600)
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env, timeout=900)


def _one_line_entries(text: str) -> Iterator[tuple[str, str]]:
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if len(words) < 3 or words[0] != "deb":
            continue
        if words[1].startswith("["):
            # Options: "[arch=amd64 signed-by=...]" may span several words.
            while words and not words[0].endswith("]"):
                words.pop(0)
            words = ["deb", *words[1:]]
        if len(words) >= 3:
            yield words[1], words[2]


def _deb822_entries(text: str) -> Iterator[tuple[str, str]]:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                yield uri, suite


def debian_mirror(apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt on this machine uses for ``bookworm`` itself (not -updates/-security)."""
    sources = [apt_dir / "sources.list"]
    sources_d = apt_dir / "sources.list.d"
    if sources_d.is_dir():
        # apt reads only these two suffixes; "x.list.disabled" and the like are ignored as by apt.
        sources += sorted(p for p in sources_d.iterdir() if p.suffix in (".list", ".sources"))
    for path in sources:
        try:
            text = path.read_text(encoding="utf-8")
        except (FileNotFoundError, IsADirectoryError):
            continue
        entries = _deb822_entries(text) if path.suffix == ".sources" else _one_line_entries(text)
        for uri, suite in entries:
            if suite == SUITE and uri.startswith(("http://", "https://", "file:")):
                return uri.rstrip("/")
    raise ClusterError(f"{apt_dir}: no 'deb' source for Debian {SUITE} in sources.list or sources.list.d/")


def mmdebstrap_argv(mirror: str, target: Path | str, options: tuple[str, ...] = (), suite: str = SUITE) -> list[str]:
    return ["mmdebstrap", "--variant=minbase", *options, f"--include={','.join(INCLUDE)}", suite, str(target), mirror]


def recipe(mirror: str, options: tuple[str, ...] = (), suite: str = SUITE) -> dict[str, object]:
    """Everything that decides the base's content: change any of it and the base is rebuilt."""
    return {
        "mmdebstrap": mmdebstrap_argv(mirror, "DIR", options, suite),
        "files": FILES,
        "masked": list(MASKED_UNITS),
        "removed": ["etc/ssh/ssh_host_*"],
        "emptied": ["etc/machine-id"],
    }


def recipe_hash(mirror: str, options: tuple[str, ...] = (), suite: str = SUITE) -> str:
    blob = json.dumps(recipe(mirror, options, suite), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_into(root: Path, relative: str, content: str | bytes, mode: int = 0o644) -> None:
    """Write a file (text, or bytes such as a keyring) inside a host's root; a symlink there is
    replaced, never followed out of it."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        write_atomic(path, content, mode)
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), "wb") as handle:
        handle.write(content)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _customize(root: Path) -> None:
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    # Empty, not absent: systemd then makes a fresh id at every boot, so no two hosts share one.
    write_into(root, "etc/machine-id", "", 0o444)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    os.chmod(root / "root/.ssh", 0o700)
    for relative, text in FILES.items():
        write_into(root, relative, text)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = units / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")


@contextlib.contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Hold ``cache/.lock`` (made with ``cache``): one builder of what ``cache`` holds at a time."""
    # Two clusters (say, a test's and the default one) may want the same cached thing at the same time.
    cache.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_base(settings: Settings, host_os: str = DEBIAN) -> Path:
    """The cached base root filesystem of ``host_os`` for the current recipe, built when missing (~30 s)."""
    if host_os == UBUNTU:
        keyring = ubuntu_archive.keyring(settings.cache_dir)
        mirror, suite = ubuntu_archive.MIRROR, ubuntu_archive.SUITE
        options = tuple(ubuntu_archive.mmdebstrap_options(keyring))
    elif host_os == DEBIAN:
        mirror, suite, options = debian_mirror(), SUITE, ()
    else:
        raise ClusterError(f"host system {host_os!r}: known are {', '.join(HOST_OSES)}")
    digest = recipe_hash(mirror, options, suite)
    base = settings.cache_dir / f"base-{digest}"
    marker = settings.cache_dir / f"base-{digest}.recipe.json"
    with cache_lock(settings.cache_dir):
        if base.is_dir() and marker.is_file():
            return base
        building = settings.cache_dir / f"base-{digest}.building"
        if building.exists():
            shutil.rmtree(building)
        for stale in (base, marker):
            if stale.is_dir():
                shutil.rmtree(stale)
            elif stale.exists():
                stale.unlink()
        log.info("image: building base %s from %s (about 30 s)", base.name, mirror)
        started = time.monotonic()
        run(mmdebstrap_argv(mirror, building, options, suite), timeout=BUILD_TIMEOUT_S)
        _customize(building)
        building.rename(base)
        written = {"hash": digest, **recipe(mirror, options, suite)}
        write_atomic(marker, json.dumps(written, indent=2, sort_keys=True) + "\n")
        log.info("image: built %s in %.1f s", base.name, time.monotonic() - started)
    return base
