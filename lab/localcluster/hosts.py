"""One test host: its overlay root, identity, cgroups, the systemd-nspawn that boots it (again after
every reboot, see ``localcluster.bootloop``), and SSH to it.

A host's files live in ``<state>/hosts/<name>/{upper,work,merged}``: ``merged`` is an overlayfs of
the shared base image and the host's own ``upper``, and is the host's ``/``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from localcluster import (
    bootloop,
    debian_sources,
    fake_kernel,
    hook,
    launch_detached,
    log,
    network,
    operator_user,
    process_argv,
    run,
)
from localcluster.fake_nvidia import PROC_DEVICES_PATH
from localcluster.hardware_spec import DEFAULT_OS, MODELS_DIR, parse_spec
from localcluster.image import write_into
from localcluster.state import ClusterError, HostRecord, Settings, write_atomic

NSPAWN = "systemd-nspawn"
# `python -m localcluster.bootloop` finds the package from here even when it is not installed.
PACKAGE_PARENT = Path(__file__).resolve().parents[1]
HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")
STOP_TIMEOUT_S = 15.0
# Launched hosts stay referenced so that Python never warns about, or reaps, a running child.
_launched: list[subprocess.Popen[bytes]] = []


def merged_dir(settings: Settings, name: str) -> Path:
    return settings.host_dir(name) / "merged"


def base_of(settings: Settings, name: str) -> str | None:
    """The base image a host's overlay was made on, or None for a host not made yet."""
    try:
        return (settings.host_dir(name) / "base").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def log_file(settings: Settings, name: str) -> Path:
    return settings.logs_dir / f"{name}.log"


def _unescape_mountinfo(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \\040-style octal escapes.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, super options) of every mount in our mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        mounts.append((_unescape_mountinfo(fields[4]), tail[0], tail[2] if len(tail) > 2 else ""))
    return mounts


def is_mounted(path: Path) -> bool:
    return any(point == str(path) for point, _, _ in _mounts())


def cgroup_roots() -> list[Path]:
    """The hierarchies systemd-nspawn places its payload in: name=systemd (v1) and the v2 one.

    A hybrid controller (systemd v1 hierarchy plus /sys/fs/cgroup/unified) has both; a pure v2
    one has only the second. Without systemd as PID 1 nobody makes a cgroup for each launcher, so
    we do: otherwise every host's payload would land in the same cgroup and their units collide.
    """
    roots = [
        Path(point)
        for point, fstype, options in _mounts()
        if (fstype == "cgroup" and "name=systemd" in options.split(",")) or fstype == "cgroup2"
    ]
    if not roots:
        raise ClusterError("controller: no cgroup2 and no name=systemd cgroup hierarchy is mounted")
    return roots


def _remove_cgroup(path: Path) -> None:
    if not path.is_dir():
        return
    # Deepest first: systemd inside the host leaves its own sub-cgroups (init.scope, system.slice).
    for dirpath, _, _ in os.walk(path, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError as exc:
            raise ClusterError(f"cgroup {dirpath}: cannot remove: {exc.strerror}") from exc


def remove_cgroups(settings: Settings, name: str) -> None:
    for root in cgroup_roots():
        _remove_cgroup(root / settings.cgroup(name))


def _cgroup_pids(settings: Settings, name: str) -> set[int]:
    pids: set[int] = set()
    for root in cgroup_roots():
        for dirpath, _, files in os.walk(root / settings.cgroup(name)):
            if "cgroup.procs" in files:
                pids.update(int(pid) for pid in (Path(dirpath) / "cgroup.procs").read_text(encoding="ascii").split())
    return pids


def end_leftovers(settings: Settings, host: HostRecord) -> None:
    """End what is left in a host's own cgroups once its boot loop is gone.

    Killing the loop or nspawn (SIGKILL, or a crash) leaves nspawn or its container's systemd
    running, reparented and untracked; the cgroups made for this host hold exactly its processes,
    so they are ended by that membership and nothing else. A no-op after a clean stop.
    """
    pids = _cgroup_pids(settings, host.name)
    if not pids:
        return
    log.warning("%s: its boot loop is gone, ending the %d processes left in its cgroups", host.name, len(pids))
    deadline = time.monotonic() + 5.0
    while pids:
        for pid in pids:
            # The host's init among them: killing it ends its whole PID namespace.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _reap(pid)
        if time.monotonic() > deadline:
            raise ClusterError(f"{host.name}: processes {sorted(pids)} stay in its cgroups after SIGKILL")
        time.sleep(0.05)
        pids = _cgroup_pids(settings, host.name)


def prune_cgroup_parents(settings: Settings) -> None:
    """Remove ``kimi-cluster/<bridge>`` and ``kimi-cluster`` where no other cluster still uses them."""
    for root in cgroup_roots():
        for parent in (root / "kimi-cluster" / settings.bridge, root / "kimi-cluster"):
            try:
                parent.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                    break
                raise ClusterError(f"cgroup {parent}: cannot remove: {exc.strerror}") from exc


def ensure_api_key(settings: Settings) -> Path:
    """The demo's API key (mode 0600): exposed demo engines demand it, the controller reads it."""
    path = settings.state_dir / "api-key"
    if not path.is_file():
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(24) + "\n")
    return path


def ensure_ssh_key(settings: Settings) -> None:
    if settings.ssh_key.is_file() and settings.ssh_key.with_suffix(".pub").is_file():
        return
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    for stale in (settings.ssh_key, settings.ssh_key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kimi-cluster", "-f", str(settings.ssh_key)])


def _etc_hosts(hosts: Sequence[HostRecord]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in hosts]
    return "\n".join(lines) + "\n"


def write_identity(settings: Settings, host: HostRecord, hosts: Sequence[HostRecord]) -> None:
    """Hostname, every cluster host by name, root's key and the cluster's Debian mirror as apt's
    source: cheap, rewritten on every ``up``."""
    root = Path(host.root)
    write_into(root, "etc/hostname", f"{host.name}\n")
    write_into(root, "etc/hosts", _etc_hosts(hosts))
    # The key lives in the state directory, which a cached base shared by clusters cannot know.
    public = settings.ssh_key.with_suffix(".pub").read_text(encoding="utf-8")
    write_into(root, "root/.ssh/authorized_keys", public, 0o600)
    # and an unprivileged operator with sudo, as a real fleet has (the deploys run as either)
    operator_user.ensure(root, public)
    # Likewise the mirror's address and signing key: this cluster's, not the base image's. A host
    # standing for an Ubuntu machine gets none: the mirror is Debian's.
    if parse_spec(host.hardware).os == DEFAULT_OS:
        debian_sources.write(settings, root)


def prepare(settings: Settings, host: HostRecord, base: Path) -> None:
    """Everything a host needs before boot; each step is skipped when already done."""
    home = settings.host_dir(host.name)
    upper, work, merged = home / "upper", home / "work", Path(host.root)
    for directory in (upper, work, merged):
        directory.mkdir(parents=True, exist_ok=True)
    # An upper layer only makes sense on the base it was made on: `up` remakes hosts when it changes.
    if base_of(settings, host.name) is None:
        write_atomic(home / "base", f"{base}\n")
    if not is_mounted(merged):
        options = f"lowerdir={base},upperdir={upper},workdir={work}"
        run(["mount", "-t", "overlay", "overlay", "-o", options, str(merged)])
    # Makes only the keys that are missing: a host keeps its identity across restarts.
    run(["ssh-keygen", "-A", "-f", str(merged)])
    spec = parse_spec(host.hardware)
    install = hook("localcluster.fake_nvidia", "install")
    if install is not None:
        install(merged, spec.accelerators)
    fake_kernel.install(merged)
    disk = models_disk(settings, host)
    if spec.models_disk_bytes is not None and not is_mounted(disk):
        disk.mkdir(parents=True, exist_ok=True)
        run(["mount", "-t", "tmpfs", "-o", f"size={spec.models_disk_bytes},mode=0755", "tmpfs", str(disk)])
    network.ensure_host_link(settings, host.name, host.address)


def models_disk(settings: Settings, host: HostRecord) -> Path:
    """The host's own small filesystem for its weights (hardware ``...-smalldisk`` only)."""
    return settings.host_dir(host.name) / "models-disk"


def known_hosts_lines(host: HostRecord) -> list[str]:
    """``known_hosts`` lines for the host's real keys, under its address and its name."""
    lines = []
    for kind in HOST_KEY_TYPES:
        pub = Path(host.root) / "etc/ssh" / f"ssh_host_{kind}_key.pub"
        if not pub.is_file():
            continue
        words = pub.read_text(encoding="utf-8").split()
        lines.append(f"{host.address},{host.name} {words[0]} {words[1]}")
    if not lines:
        raise ClusterError(f"{host.name}: no host keys under {host.root}/etc/ssh")
    return lines


def nspawn_argv(settings: Settings, host: HostRecord) -> list[str]:
    netns = settings.netns(host.name)
    return [
        NSPAWN,
        f"--directory={host.root}",
        "--boot",
        # The machine name must be unique on the controller; the hostname is what the host sees.
        f"--machine={netns}",
        f"--hostname={host.name}",
        f"--network-namespace-path={network.NETNS_DIR / netns}",
        # No systemd on the controller to register with or to make a scope unit for us.
        "--register=no",
        "--keep-unit",
        "--console=passive",
        "--link-journal=no",
        "--resolv-conf=off",
        "--timezone=off",
        # tc (bandwidth shaping) inside the host.
        "--capability=CAP_NET_ADMIN",
        # A host with NVIDIA's stand-in driver sees the character devices its module registers. (nspawn
        # takes the source of a bind under /proc from inside the host's root.)
        *([f"--bind-ro=/{PROC_DEVICES_PATH}:/proc/devices"] if (Path(host.root) / PROC_DEVICES_PATH).is_file() else []),
        *(
            [f"--bind={models_disk(settings, host)}:{MODELS_DIR}"]
            if parse_spec(host.hardware).models_disk_bytes is not None
            else []
        ),
    ]


def is_running(host: HostRecord) -> bool:
    """The recorded PID is alive and is still the boot loop (or systemd-nspawn) of this host's root.

    Hosts launched before the boot loop existed recorded their systemd-nspawn itself; they count too.
    """
    if host.pid is None:
        return False
    argv = process_argv(host.pid)
    if not argv:
        return False
    launcher = argv[1:3] == ["-m", bootloop.MODULE] or Path(argv[0]).name == NSPAWN
    return launcher and f"--directory={host.root}" in argv


def launch_argv(settings: Settings, host: HostRecord, cgroups: Sequence[Path]) -> list[str]:
    """The host's boot loop around its systemd-nspawn (see ``localcluster.bootloop``)."""
    groups = [arg for group in cgroups for arg in ("--cgroup", str(group))]
    return [sys.executable, "-m", bootloop.MODULE, *groups, "--", *nspawn_argv(settings, host)]


def launch(settings: Settings, host: HostRecord) -> int:
    """Start the host's boot loop in its own session and cgroups; return its PID (the host's PID).

    The loop joins ``<host cgroup>/bootloop`` before exec and starts nspawn in the host's cgroup, so
    nspawn makes its payload cgroup under the host's own one from the start (moving it afterwards
    would race with nspawn), and again at every reboot.
    """
    procs_fds = []
    groups = []
    try:
        for root in cgroup_roots():
            group = root / settings.cgroup(host.name)
            _remove_cgroup(group)
            (group / bootloop.LOOP_CGROUP).mkdir(parents=True)
            groups.append(group)
            procs_fds.append(os.open(group / bootloop.LOOP_CGROUP / "cgroup.procs", os.O_WRONLY))

        def join_cgroups() -> None:
            # Runs in the child between fork and exec. Only os.write on descriptors opened above:
            # nothing here takes a lock, so it is safe even if the parent has threads.
            for fd in procs_fds:
                os.write(fd, b"0")

        proc = launch_detached(
            launch_argv(settings, host, groups),
            log_file(settings, host.name),
            f"launching {host.name}",
            cwd=PACKAGE_PARENT,
            preexec_fn=join_cgroups,
        )
    finally:
        for fd in procs_fds:
            os.close(fd)
    _launched.append(proc)
    return proc.pid


def ssh_argv(settings: Settings, address: str, remote: Sequence[str], connect_timeout: int = 3) -> list[str]:
    """SSH as root to a host with the cluster's key and strict host key checking."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(settings.ssh_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={settings.known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "LogLevel=ERROR",
        f"root@{address}",
        "--",
        # ssh hands the remote side one command line: quote each word for its shell.
        shlex.join(remote),
    ]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"({path} does not exist)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


def wait_ready(settings: Settings, host: HostRecord, timeout: float) -> list[str]:
    """Wait until systemd in the host has finished booting; return its failed units (if degraded)."""
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while True:
        if not is_running(host):
            raise ClusterError(
                f"{host.name}: systemd-nspawn ended during boot (pid {host.pid}); see {log_file(settings, host.name)}",
                log_tail(log_file(settings, host.name)),
            )
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClusterError(
                f"{host.name} ({host.address}): not ready within {timeout:.0f} s: {last_error}",
                log_tail(log_file(settings, host.name)),
            )
        argv = ssh_argv(settings, host.address, ["systemctl", "is-system-running", "--wait"])
        try:
            proc = run(argv, check=False, timeout=remaining)
        except ClusterError:
            continue  # timed out: the deadline check above reports it
        if proc.returncode == 255:
            # sshd not listening yet (or refusing us): try again shortly.
            last_error = (proc.stderr.strip().splitlines() or ["ssh failed"])[-1]
            time.sleep(0.2)
            continue
        system = proc.stdout.strip()
        if system == "running":
            return []
        if system == "degraded":
            failed = run(
                ssh_argv(settings, host.address, ["systemctl", "--failed", "--plain", "--no-legend", "--no-pager"]),
                check=False,
            ).stdout
            return [line.split()[0] for line in failed.splitlines() if line.strip()]
        raise ClusterError(f"{host.name} ({host.address}): systemd reports {system or proc.stderr.strip()!r}")


def _reap(pid: int) -> None:
    # A host launched by this very process would otherwise linger as a zombie.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(hosts: list[tuple[HostRecord, int]], seconds: float) -> list[tuple[HostRecord, int]]:
    deadline = time.monotonic() + seconds
    left = hosts
    while left:
        for _, pid in left:
            _reap(pid)
        left = [(h, pid) for h, pid in left if is_running(h)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return left


def stop(settings: Settings, hosts: Iterable[HostRecord], timeout: float = STOP_TIMEOUT_S) -> None:
    """Power the hosts off (SIGTERM to their recorded boot loop, which hands it to nspawn: a clean
    shutdown, and no boot after it) and wait for it.

    Only a PID that is still this host's boot loop (or nspawn) is signalled; one left after
    ``timeout`` is killed, and so is what a killed loop or nspawn leaves in the host's cgroups.
    """
    hosts = list(hosts)
    running = [(h, h.pid) for h in hosts if h.pid is not None and is_running(h)]
    for _, pid in running:
        os.kill(pid, signal.SIGTERM)
    left = _wait_gone(running, timeout)
    for host, pid in left:
        log.warning("%s: still up %.0f s after SIGTERM, killing pid %d", host.name, timeout, pid)
        os.kill(pid, signal.SIGKILL)
    left = _wait_gone(left, 5.0)
    if left:
        names = ", ".join(f"{h.name} (pid {pid})" for h, pid in left)
        raise ClusterError(f"hosts {names}: still running after SIGKILL")
    for host in hosts:
        end_leftovers(settings, host)


def destroy(settings: Settings, host: HostRecord) -> None:
    """Remove a stopped host: its overlay, network namespace and veth, cgroups and files."""
    merged = Path(host.root)
    if is_mounted(merged):
        run(["umount", str(merged)])
    disk = models_disk(settings, host)
    if is_mounted(disk):
        run(["umount", str(disk)])
    if is_mounted(merged):
        raise ClusterError(f"{host.name}: {merged} is still mounted; not removing its files")
    network.delete_host_link(settings, host.name, host.address)
    remove_cgroups(settings, host.name)
    home = settings.host_dir(host.name)
    if home.exists():
        shutil.rmtree(home)
