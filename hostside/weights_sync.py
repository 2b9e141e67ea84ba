"""Sync one model revision with huggingface_hub and verify every file against the lock.

Run with the python of the tools venv that has huggingface_hub. Input: one argument, base64 of
zlib-compressed JSON: {"repo", "revision", "dir", "lock": {path: [size, digest]}, "endpoint",
"token_file", "retries", "workers"}. Prints one JSON line; exit 0 when every file matches the lock,
3 when the disk is too small (nothing downloaded), 4 when a file still mismatches after retries.

Verification results are cached in DIR/.kimi/verify-cache.json by (size, mtime_ns, inode), so an
unchanged file is never hashed twice.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

META = ".kimi"


def _hash(path: str, kind: str, size: int) -> str:
    """``sha256:<hex>`` (LFS files) or ``gitblob:<hex>`` (git's blob id, for small files)."""
    header = f"blob {size}\0".encode()
    digest = hashlib.sha1(header, usedforsecurity=False) if kind == "gitblob" else hashlib.sha256()
    with open(path, "rb") as f:
        # hashlib releases the GIL on large updates: threads hash files in parallel.
        for block in iter(lambda: f.read(8 << 20), b""):
            digest.update(block)
    return f"{kind}:{digest.hexdigest()}"


def _load_cache(root: str) -> dict[str, list[Any]]:
    try:
        with open(os.path.join(root, META, "verify-cache.json"), encoding="utf-8") as f:
            data: dict[str, list[Any]] = json.load(f)
            return data
    except (OSError, ValueError):
        return {}


def _save_json(root: str, name: str, data: Any) -> None:
    os.makedirs(os.path.join(root, META), exist_ok=True)
    tmp = os.path.join(root, META, f".{name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, os.path.join(root, META, name))


def _prune(root: str, lock: dict[str, list[Any]]) -> list[str]:
    """Remove files the lock does not name (and partial downloads); keep metadata folders."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in (META, ".cache")]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel not in lock:
                os.remove(os.path.join(dirpath, name))
                removed.append(rel)
    incomplete = os.path.join(root, ".cache", "huggingface", "download")
    for dirpath, _, filenames in os.walk(incomplete):
        for name in filenames:
            if name.endswith(".incomplete"):
                os.remove(os.path.join(dirpath, name))
                removed.append(os.path.relpath(os.path.join(dirpath, name), root))
    return removed


def _verify(root: str, lock: dict[str, list[Any]], cache: dict[str, list[Any]], workers: int) -> list[str]:
    """Files that do not match the lock; updates ``cache`` for every file hashed."""

    def check(rel: str) -> str | None:
        size, sha = lock[rel]
        path = os.path.join(root, rel)
        try:
            st = os.stat(path)
        except OSError:
            return rel
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        entry = cache.get(rel)
        if entry is not None and entry[:3] == key:
            found = entry[3]
        else:
            kind = sha.split(":", 1)[0]
            found = _hash(path, kind, size) if st.st_size == size else f"size:{st.st_size}"
            cache[rel] = [*key, found]
        return None if found == sha else rel

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sorted(r for r in pool.map(check, sorted(lock)) if r is not None)


def _fail(result: dict[str, Any], message: str, code: int) -> None:
    """One line for the operator (stderr), the details as JSON (stdout, shown with -v)."""
    print(json.dumps(result))
    print(f"kimi-deploy: {message}", file=sys.stderr)
    sys.exit(code)


def _link_from_siblings(root: str, lock: dict[str, list[Any]], cache: dict[str, list[Any]]) -> list[str]:
    """Hard-link files another revision of the same model already holds verified with the same
    digest: an upgrade downloads only what changed, and both revisions stay whole on disk."""
    parent = os.path.dirname(root.rstrip("/"))
    wanted = {lock[rel][1]: rel for rel in lock if not os.path.exists(os.path.join(root, rel))}
    linked: list[str] = []
    if not wanted or not os.path.isdir(parent):
        return linked
    for sibling in sorted(os.listdir(parent)):
        other = os.path.join(parent, sibling)
        if other == root.rstrip("/") or not os.path.isdir(other):
            continue
        for rel, entry in _load_cache(other).items():
            target = wanted.get(entry[3])
            if target is None or os.path.exists(os.path.join(root, target)):
                continue
            source = os.path.join(other, rel)
            try:
                st = os.stat(source)
                if [st.st_size, st.st_mtime_ns, st.st_ino] != entry[:3]:
                    continue  # changed since it was verified: not to be trusted
                os.makedirs(os.path.dirname(os.path.join(root, target)), exist_ok=True)
                os.link(source, os.path.join(root, target))
            except OSError:
                continue
            cache[target] = list(entry)
            linked.append(target)
    return linked


def main() -> None:
    req = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
    try:
        sync(req)
    except Exception as exc:  # noqa: BLE001 - whatever the Hub client raises, say it in one line
        # The client often wraps the HTTP error ("failed due to the above error"): name the root.
        root = exc
        while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        first = (str(root).strip().splitlines() or [""])[0][:300]
        exc = root
        where = req.get("endpoint") or "the Hub"
        _fail(
            {"error": "hub", "type": type(exc).__name__, "message": first},
            f"weights {req['repo']}@{req['revision'][:12]}: {where}: {type(exc).__name__}: {first}",
            5,
        )


def sync(req: dict[str, Any]) -> None:
    root, lock = req["dir"], req["lock"]
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if req.get("endpoint"):
        os.environ["HF_ENDPOINT"] = req["endpoint"]
    if req.get("token_file") and os.path.exists(req["token_file"]):
        os.environ["HF_TOKEN_PATH"] = req["token_file"]
    # Imported after the environment above is set: huggingface_hub reads it at import.
    from huggingface_hub import hf_hub_download, snapshot_download  # noqa: PLC0415
    from huggingface_hub.utils import logging as hf_logging  # noqa: PLC0415

    # Its retry chatter would bury the one line that says what failed.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]

    started = time.monotonic()
    os.makedirs(root, exist_ok=True)
    removed = _prune(root, lock)
    # A full verify trusts nothing cached: every file is hashed again.
    cache = {} if req.get("full") else _load_cache(root)
    linked = [] if req.get("full") else _link_from_siblings(root, lock, cache)
    workers = int(req.get("workers") or max(2, os.cpu_count() or 2))
    bad = _verify(root, lock, cache, workers)
    have = sum(lock[r][0] for r in lock if r not in bad)
    need = sum(size for size, _ in lock.values()) - have
    free = shutil.disk_usage(root).free
    if bad and need > free:
        _fail(
            {"error": "disk", "needed": need, "free": free, "dir": root},
            f"weights need {need} more bytes in {root}, {free} are free",
            3,
        )
    fetched: list[str] = []
    if bad:
        for rel in bad:
            if os.path.exists(os.path.join(root, rel)):
                os.remove(os.path.join(root, rel))
        snapshot_download(req["repo"], revision=req["revision"], local_dir=root, allow_patterns=bad)
        fetched += bad
        bad = _verify(root, lock, cache, workers)
        for _ in range(int(req.get("retries", 2))):
            if not bad:
                break
            for rel in bad:
                if os.path.exists(os.path.join(root, rel)):
                    os.remove(os.path.join(root, rel))
                hf_hub_download(req["repo"], rel, revision=req["revision"], local_dir=root, force_download=True)
            fetched += bad
            bad = _verify(root, lock, cache, workers)
    _save_json(root, "verify-cache.json", {r: cache[r] for r in lock if r in cache})
    if bad:
        rel = bad[0]
        found = cache.get(rel, [None] * 4)[3]
        _fail(
            {"error": "mismatch", "file": rel, "expected": lock[rel][1], "found": found},
            f"{rel} does not match the lock after retries: expected {lock[rel][1]}, found {found}",
            4,
        )
    print(json.dumps({
        "ok": True, "fetched": sorted(set(fetched)), "linked": len(linked), "removed": removed,
        "seconds": round(time.monotonic() - started, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
