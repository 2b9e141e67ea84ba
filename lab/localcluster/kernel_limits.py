"""The machine's kernel limits that a cluster's hosts share, raised where they would stop it.

Every host is a systemd-nspawn machine whose processes run as the machine's own root, so their
inotify objects (systemd, journald and logind each hold a few; systemd watches every unit and
cgroup folder) count against root's ``fs.inotify.max_user_instances`` and
``fs.inotify.max_user_watches``. Debian's defaults (128 instances) stop ``cluster up`` at about
35 hosts with systemd's ``Failed to create control group inotify object: Too many open files``.

Before any host is launched, ``up`` reads what the machine already uses and what it allows, and
raises a limit only where what is in use plus what the new hosts need would pass it, with a line
saying so; a limit already high enough is left as it is, and nothing is ever lowered (other
clusters on the same machine may need what was raised). When a limit cannot be raised (a
read-only ``/proc/sys``), ``up`` stops before launching anything, naming the limit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from localcluster.state import ClusterError

PROC = Path("/proc")


@dataclass(frozen=True)
class Limit:
    """One sysctl and what each booted host takes of it."""

    name: str
    per_host: int
    # what in-use figure to add: inotify instances can be counted, watches cannot cheaply
    counted: bool
    # what the machine itself (the controller, an editor, other services) may add meanwhile
    headroom: int


# Measured on 16 booted hosts of the cluster's base image (Debian 12, systemd 252): 8 inotify
# instances and about 30 watches each; the figures below leave room for a host's services.
LIMITS = (
    Limit("fs.inotify.max_user_instances", per_host=16, counted=True, headroom=128),
    Limit("fs.inotify.max_user_watches", per_host=1024, counted=False, headroom=65536),
)


def inotify_instances(uid: int = 0, proc: Path = PROC) -> int:
    """How many inotify objects processes of ``uid`` hold now (one per such file descriptor)."""
    count = 0
    for pid in _pids(proc):
        try:
            if (pid / "status").stat().st_uid != uid:
                continue
            for fd in (pid / "fd").iterdir():
                if os.readlink(fd) == "anon_inode:inotify":
                    count += 1
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return count


def _pids(proc: Path) -> Iterator[Path]:
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield entry


def needed(limit: Limit, new_hosts: int, in_use: int) -> int:
    """The value ``limit`` must have for ``new_hosts`` more hosts beside what is ``in_use``."""
    return in_use + limit.per_host * new_hosts + limit.headroom


def ensure(new_hosts: int, proc: Path = PROC) -> list[str]:
    """Raise each limit that ``new_hosts`` more hosts would pass; one line per limit raised.

    Raises ClusterError naming the limit when one must be raised and cannot be."""
    said: list[str] = []
    if new_hosts <= 0:
        return said
    for limit in LIMITS:
        path = proc.joinpath("sys", *limit.name.split("."))
        try:
            now = int(path.read_text(encoding="ascii").split()[0])
        except (OSError, ValueError, IndexError) as exc:
            raise ClusterError(f"{limit.name}: cannot read {path} ({exc})") from exc
        in_use = inotify_instances(proc=proc) if limit.counted else 0
        want = needed(limit, new_hosts, in_use)
        if now >= want:
            continue
        try:
            path.write_text(f"{want}\n", encoding="ascii")
        except OSError as exc:
            raise ClusterError(
                f"{limit.name} is {now}, {new_hosts} more hosts need {want} "
                f"({in_use} in use + {limit.per_host} per host): cannot raise it ({exc.strerror or exc}); "
                f"raise it with `sysctl -w {limit.name}={want}` or ask for fewer hosts"
            ) from exc
        said.append(f"{limit.name}: raised {now} -> {want} for {new_hosts} more hosts (never lowered again)")
    return said
