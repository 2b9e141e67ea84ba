"""Package locks of engine and tool releases: which lock a host installs a release from.

A release (one venv per pinned version, see ``host_paths.release_dir``) is installed with uv from a
lock: the exact ``name==version`` set with the index's hashes, written into the venv as
``.kimi-lock.txt``. Pure: reads probe results.

Where a host's lock comes from:

- ``own``: its copy of the release is damaged but its lock is intact: rebuilt from that lock;
- ``controller``: the controller's, resolved for the host's platform (``kimi_deploy.releases.lock``):
  every host of that platform installs the same one, and no host installs a set of packages
  another host chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kimi_deploy.hostside.probe_types import Damage, ReleaseMarker

LOCK_FILE = ".kimi-lock.txt"


@dataclass(frozen=True)
class LockSource:
    kind: Literal["own", "controller"]
    # the lock's sha256 ("own")
    sha256: str | None = None


def lock_source(marker: ReleaseMarker | None) -> LockSource | None:
    """Where a host whose probe found ``marker`` in a release's folder takes the release's lock
    from; None: nothing to install (a complete, undamaged release)."""
    if marker is not None and not marker.get("damaged"):
        return None
    own = (marker or {}).get("lock") or {}
    damaged = (marker or {}).get("damaged")
    if damaged is not None and damaged.get("lock_intact") and own.get("sha256"):
        return LockSource("own", own["sha256"])
    return LockSource("controller")


def damage_line(path: str, damaged: Damage) -> str:
    """One line on a damaged release: how many files, which ones first."""
    count = int(damaged.get("count", 0))
    first = ", ".join(damaged.get("first") or [])
    files = "1 file" if count == 1 else f"{count} files"
    return f"{path}: {files} missing or changed since install ({first})"
