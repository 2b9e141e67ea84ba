"""A revision folder's own files, named once for the sync (the writer) and the peer (a reader).

``<dir>/.kimi/verify-cache.json``: ``{path: [size, mtime_ns, inode, digest]}``, each file's last
verdict, saved after every file placed, so a peer serves a file as soon as it is verified;
``<dir>/.kimi/partial/<sha256 of the path>``: a file arriving from a peer or a mirror, hashed as
it is written and moved into place only when it matches the lock (a new inode for every try);
``<dir>/.kimi/lock``: held (flock) by the sync or scrub at work; ``<dir>/.kimi/sync-started`` and
``<dir>/.kimi/synced``: touched when a sync (or scrub) begins and ends, whatever its result;
``<dir>/.kimi/progress``: the bytes in and to come while files arrive (``hostside.progress_file``).
"""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # for type checkers only: the probe imports this and no typing
if TYPE_CHECKING:
    from typing import Any

META = ".kimi"
CACHE = "verify-cache.json"
PROGRESS = "progress"
# The verification cache of a revision is a few KiB per hundred files.
CACHE_BYTES = 16 << 20


def meta(root: str, name: str) -> str:
    return os.path.join(root, META, name)


def partial_path(root: str, rel: str) -> str:
    """One flat name per file, whatever its depth and length."""
    import hashlib  # noqa: PLC0415 - the probe reads verdicts through this module and hashes nothing

    return os.path.join(root, META, "partial", hashlib.sha256(rel.encode()).hexdigest())


def load_cache(root: str) -> dict[str, list[Any]]:
    """The revision's verification cache, its well-formed entries only; empty when missing,
    unreadable or over ``CACHE_BYTES``."""
    try:
        with open(meta(root, CACHE), "rb") as f:
            if os.fstat(f.fileno()).st_size > CACHE_BYTES:
                return {}
            data = json.loads(f.read(CACHE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 4}
