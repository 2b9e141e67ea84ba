"""Package locks of engine and tool releases: which lock a host installs a release from.

A release (one venv per pinned version, see ``host_paths.release_dir``) is installed with uv from a
lock: the exact ``name==version`` set with the index's hashes, resolved once on a host (its Python,
its platform) and written into the venv as ``.kimi-lock.txt``. Every other host installing the same
release installs that lock, so the same versions come back everywhere. Pure: reads probe results.

Where a host's lock comes from, first match wins:

- ``own``: its copy of the release is damaged but its lock is intact: rebuilt from that lock;
- ``peer``: another host of the run holds the release complete: its lock, read from that host;
- ``resolver``: several hosts install it and none holds it: the first of them (inventory order)
  resolves the lock before any installs, and all of them install that one;
- ``here``: this host alone installs it: it resolves while installing.

A lock read from another host (``peer``, ``resolver``) is that host's word: it is checked here,
before it goes anywhere, by the same rule the installing host applies (``lock_refusal``). The rule
fixes how its packages arrive (hashed wheels from the recipe's index) and that the recipe's pins
are among them, not which others it pins: the host that wrote it may add any wheel the index
serves. Installing runs none of a release's code (``hostside/venv_install.py``); running the
release does, as whoever runs it (the tools release: root, for the weights sync).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hostside.boundary_lock import check_lock
from hostside.host_dirs import STATE_DIR
from hostside.probe_types import Damage

LOCK_FILE = ".kimi-lock.txt"
# Locks a resolver host resolved for the other hosts of a run: ``LOCKS_DIR/<release folder>@<run>.txt``.
LOCKS_DIR = f"{STATE_DIR}/locks"


def staged_lock(path: str, run: str) -> str:
    """Where a resolver host leaves the lock it resolved in run ``run`` for the release at ``path``
    (named by the run: a lock left by an earlier run is never taken for this one's)."""
    return f"{LOCKS_DIR}/{path.rstrip('/').rsplit('/', 1)[-1]}@{run}.txt"


@dataclass(frozen=True)
class LockSource:
    kind: Literal["own", "peer", "resolver", "here"]
    # the host holding or resolving the lock (None for "here")
    host: str | None = None
    # the lock's sha256 when it exists already ("own", "peer")
    sha256: str | None = None


def _usable(marker: Any, requirements: list[str]) -> bool:
    """A complete, undamaged install of these pins whose lock is known."""
    return (
        isinstance(marker, dict)
        and marker.get("requirements") == requirements
        and not marker.get("damaged")
        and bool((marker.get("lock") or {}).get("sha256"))
    )


def _needs_install(marker: Any) -> bool:
    return marker is None or bool(isinstance(marker, dict) and marker.get("damaged"))


def lock_source(
    me: str, path: str, requirements: list[str], probed: Mapping[str, Any], order: Sequence[str]
) -> LockSource | None:
    """Where host ``me`` takes the lock of the release at ``path`` from; None: nothing to install.

    ``probed``: each host's probe result (``state_probe.py``; an exception for a host that did not
    answer); ``order``: the run's hosts in inventory order. Every host computes the same answer
    from the same probes, so all agree on who resolves.
    """
    mine = probed.get(me)
    marker = mine["venvs"].get(path) if isinstance(mine, dict) else None
    if not _needs_install(marker):
        return None
    found: dict[str, Any] = marker or {}
    own = found.get("lock") or {}
    if (found.get("damaged") or {}).get("lock_intact") and own.get("sha256"):
        return LockSource("own", me, own["sha256"])
    holders = []
    installers = []
    for name in order:
        result = probed.get(name)
        if not isinstance(result, dict) or path not in result.get("venvs", {}):
            continue
        theirs = result["venvs"][path]
        if _usable(theirs, requirements):
            holders.append((name, theirs["lock"]["sha256"]))
        elif _needs_install(theirs):
            installers.append(name)
    if holders:
        name, sha256 = holders[0]
        return LockSource("peer", name, sha256)
    if len(installers) > 1 and me in installers:
        return LockSource("resolver", installers[0])
    return LockSource("here")


def damage_line(path: str, damaged: Damage) -> str:
    """One line on a damaged release: how many files, which ones first."""
    count = int(damaged.get("count", 0))
    first = ", ".join(damaged.get("first") or [])
    files = "1 file" if count == 1 else f"{count} files"
    return f"{path}: {files} missing or changed since install ({first})"


def lock_refusal(path: str, host: str, text: str, requirements: list[str]) -> str | None:
    """One line when the lock text of the release at ``path`` read from ``host`` may not be
    installed, None when it may: only hashed ``name==version`` lines (no option, URL, path, extra
    or marker), pinning every ``name==version`` of ``requirements`` (the recipe's) at its version."""
    try:
        check_lock(text, requirements)
    except ValueError as exc:
        return f"{path}: the lock read from {host} is refused: {exc}"
    return None
