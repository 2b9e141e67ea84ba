"""What the probe reads of a unit's compile cache: the artifact of its key, and the engine's copy.

``found(asked)``, for each ``{"dir", "engine_dir"}`` asked (the artifact folder and the engine's
cache folder, ``kimi_deploy.compile_cache.key``), by ``dir``: ``{"manifest": {path: [size,
digest]} | None, "whole": bool, "given": {"key", "manifest"} | None}``. ``manifest`` is the
artifact's record (``compile_cache_pack.py``, ``compile_cache_place.py``), ``whole`` whether every
file it names is there unchanged since it was verified (size, mtime, inode against the folder's
verification cache: nothing is hashed), ``given`` the marker of the copy the engine has
(``compile_cache_place.MARKER``). The engine's folder is its user's: its marker is read without
following a link, bounded, and kept only when it is two short strings.
"""

from __future__ import annotations

import json
import os

from kimi_deploy.hostside.revision_files import load_cache, meta

TYPE_CHECKING = False  # for type checkers only: the probe imports no more than it runs (no typing)
if TYPE_CHECKING:
    from typing import Any

MANIFEST = "manifest.json"  # compile_cache_pack.MANIFEST
# In the engine's cache folder: the key and the manifest's digest of the copy it holds.
MARKER = ".kimi-compile-cache"
MANIFEST_BYTES = 1 << 20
MARKER_BYTES = 4096
_HEX = frozenset("0123456789abcdef")


def manifest_digest(manifest: dict[str, Any]) -> str:
    """The digest a manifest is held by: sha256 of its canonical JSON."""
    import hashlib  # noqa: PLC0415 - the probe reads manifests and never digests one

    text = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def entry_ok(entry: object) -> bool:
    """Whether ``entry`` is a manifest's ``[size, "sha256:<hex>"]``: the one rule for a manifest,
    whether the probe reads it from a host's artifact or the controller from a pack's answer."""
    if not (isinstance(entry, list) and len(entry) == 2):
        return False
    size, digest = entry
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(digest, str)
        and len(digest) == 71
        and digest.startswith("sha256:")
        and set(digest[7:]) <= _HEX
    )


def _manifest(root: str) -> dict[str, Any] | None:
    try:
        with open(meta(root, MANIFEST), "rb") as f:
            data = json.loads(f.read(MANIFEST_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    return data if all(entry_ok(entry) for entry in data.values()) else None


def _whole(root: str, manifest: dict[str, Any]) -> bool:
    verdicts = load_cache(root)
    for rel, (size, digest) in manifest.items():
        verdict = verdicts.get(rel)
        try:
            st = os.lstat(os.path.join(root, rel))
        except OSError:
            return False
        if verdict != [st.st_size, st.st_mtime_ns, st.st_ino, digest] or st.st_size != size:
            return False
    return True


def _given(engine_dir: str) -> dict[str, str] | None:
    try:
        fd = os.open(os.path.join(engine_dir, MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(MARKER_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != {"key", "manifest"}:
        return None
    if not all(isinstance(v, str) and len(v) <= 200 for v in data.values()):
        return None
    return {"key": data["key"], "manifest": data["manifest"]}


def found(asked: list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """Each asked compile cache, by its artifact folder."""
    out: dict[str, dict[str, Any]] = {}
    for ask in asked:
        root = ask["dir"]
        manifest = _manifest(root)
        out[root] = {
            "manifest": manifest,
            "whole": manifest is not None and _whole(root, manifest),
            "given": _given(ask["engine_dir"]),
        }
    return out
