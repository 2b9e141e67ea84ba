"""Pack what an engine compiled into the artifact of its key, for this host and the others.

Run as root with the host's python3. Input: one argument, base64 of zlib-compressed JSON:
{"source": the engine's cache folder, "user": the engine's user, "dir": the artifact folder
(``kimi_deploy.compile_cache.key``), "most_files": int, "most_bytes": int}.

The engine wrote ``source`` as its own user: what it holds is read as hostile. Only regular files
the engine's user owns are packed, found and opened by folder descriptor without following a link
at any depth (a link the engine swaps in mid-walk leads root nowhere), copied and hashed in one
pass, so the digest is of the bytes packed whatever the engine does meanwhile; a link, a device,
another user's file or a name that is not plain text is left out and counted. Past
``most_files`` files or ``most_bytes`` bytes nothing is packed. The copy is made beside ``dir``
and renamed into place whole: folders 0755, files 0644, root's. ``.kimi/verify-cache.json``
holds each file's verdict in the weights' form (``hostside.revision_files``), so the weights'
peer service (weights_peer.py) serves the artifact as it serves a revision;
``.kimi/manifest.json`` holds the manifest.

Prints one JSON line: ``{"dir", "manifest": {path: [size, "sha256:<hex>"]}, "bytes", "left_out"}``
(``manifest`` empty when ``source`` holds nothing: no artifact is made); an artifact already in
place is answered as it is. Exit 0; 2 when the bounds are passed (nothing packed).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import stat
import sys
from typing import Any

from kimi_deploy.hostside.boundary_names import BadName, check_names
from kimi_deploy.hostside.compile_cache_found import MARKER
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.revision_files import CACHE, META, meta

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import CompileCachePackRequest

MANIFEST = "manifest.json"
FILE_MODE = 0o644
DIR_MODE = 0o755
CHUNK = 1 << 20


class TooLarge(Exception):
    """The engine's cache is past the request's bounds."""


def _packed(root: str) -> dict[str, Any] | None:
    """The manifest of an artifact already in place, None without one."""
    try:
        with open(meta(root, MANIFEST), encoding="utf-8") as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _copy(dir_fd: int, name: str, dst: str, most: int) -> tuple[int, str]:
    """Copy ``name`` in the folder ``dir_fd`` (not a link) to ``dst`` (0644), hashing what is
    written: its size and digest."""
    digest = hashlib.sha256()
    size = 0
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f, open(dst, "xb") as out:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{name}: not a regular file")
        while chunk := f.read(CHUNK):
            size += len(chunk)
            if size > most:
                raise TooLarge(f"past {most} bytes")
            digest.update(chunk)
            out.write(chunk)
    os.chmod(dst, FILE_MODE)
    return size, f"sha256:{digest.hexdigest()}"


def pack(req: CompileCachePackRequest) -> dict[str, Any]:
    source, root = req["source"], req["dir"]
    found = _packed(root)
    if found is not None:
        return {"dir": root, "manifest": found, "bytes": sum(e[0] for e in found.values()), "left_out": 0}
    if not os.path.isdir(source) or os.path.islink(source):
        return {"dir": root, "manifest": {}, "bytes": 0, "left_out": 0}
    os.makedirs(os.path.dirname(root), mode=DIR_MODE, exist_ok=True)
    staging = f"{root}.packing"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(os.path.join(staging, META), mode=DIR_MODE)
    try:
        manifest, verdicts, left_out = _walk(source, staging, req)
        if not manifest:
            shutil.rmtree(staging)
            return {"dir": root, "manifest": {}, "bytes": 0, "left_out": left_out}
        for name, data in ((CACHE, verdicts), (MANIFEST, manifest)):
            with open(os.path.join(staging, META, name), "x", encoding="utf-8") as f:
                json.dump(data, f, sort_keys=True)
            os.chmod(os.path.join(staging, META, name), FILE_MODE)
        for parent, dirs, _ in os.walk(staging):
            for name in dirs:
                os.chmod(os.path.join(parent, name), DIR_MODE)
        os.chmod(staging, DIR_MODE)
        # a folder there without a manifest is a placement that never finished: this one replaces it
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"dir": root, "manifest": manifest, "bytes": sum(e[0] for e in manifest.values()), "left_out": left_out}


def _walk(
    source: str, staging: str, req: CompileCachePackRequest
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], int]:
    """Copy into ``staging`` the regular files under ``source`` the engine's user owns, walked by
    folder descriptor (``os.fwalk``): no link is followed at any depth, whatever the engine changes
    meanwhile. The manifest, the verdicts, and how many entries were left out (links, devices,
    another user's files, names that are not plain)."""
    uid = pwd.getpwnam(req["user"]).pw_uid
    manifest: dict[str, list[Any]] = {}
    verdicts: dict[str, list[Any]] = {}
    left_out = total = 0
    for parent, dirs, files, dir_fd in os.fwalk(source, follow_symlinks=False):
        links = [d for d in dirs if stat.S_ISLNK(os.lstat(d, dir_fd=dir_fd).st_mode)]
        left_out += len(links)
        dirs[:] = [d for d in dirs if d not in links]
        for name in sorted(files):
            rel = os.path.relpath(os.path.join(parent, name), source).replace(os.sep, "/")
            if rel == MARKER:  # the copy's marker (compile_cache_place), not the engine's
                continue
            st = os.lstat(name, dir_fd=dir_fd)
            try:
                check_names({rel: None})
            except BadName:
                left_out += 1
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                left_out += 1
                continue
            if len(manifest) >= int(req["most_files"]):
                raise TooLarge(f"past {req['most_files']} files")
            dst = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(dst), mode=DIR_MODE, exist_ok=True)
            try:
                size, digest = _copy(dir_fd, name, dst, int(req["most_bytes"]) - total)
            except FileNotFoundError:
                left_out += 1  # the engine removed it meanwhile
                continue
            total += size
            placed = os.stat(dst)
            manifest[rel] = [size, digest]
            verdicts[rel] = [placed.st_size, placed.st_mtime_ns, placed.st_ino, digest]
    return dict(sorted(manifest.items())), verdicts, left_out


def main() -> None:
    req = read_request()
    old = os.umask(0o022)
    try:
        answer = pack(req)
    except TooLarge as exc:
        print(json.dumps({"dir": req.get("dir"), "error": "too large", "message": str(exc)}))
        print(f"kimi-deploy: compile cache {req.get('source')}: {exc}: not packed", file=sys.stderr)
        sys.exit(2)
    finally:
        os.umask(old)
    print(json.dumps(answer, sort_keys=True))


if __name__ == "__main__":
    main()
