"""Place the compile cache of a key on this host, from a host of the run that packed it.

Run as root with the host's python3. Input: one argument, base64 of zlib-compressed JSON:
{"dir": the artifact folder (``kimi_deploy.compile_cache.key``), "manifest": {path: [size,
"sha256:<hex>"]}: the controller's, "peers": [{"host", "url"}], "peer_key_file", "progress_log",
"engine_dir": the folder the engine keeps that cache in, "owner_root": the unit's cache folder
(systemd's CacheDirectory=), "user": the engine's user}.

The files come through the weights' relay (weights_sync.py fetching from weights_peer.py, with
the run's transfer key), each hashed as it arrives and kept only when it matches the manifest the
controller holds; nothing comes from the Hub (``"hub": false``). A first placement is made in
``<dir>.placing`` and renamed to ``dir`` once whole, so a unit binding ``dir`` never sees a part; a
folder already in place is verified (a file changed since its verdict is hashed again), and what
does not match is fetched again, what the manifest does not name is removed. Then
``.kimi/manifest.json`` holds the manifest, and every file is root's, 0644.

Then the engine gets its own copy: the engine writes the cache it starts from (vLLM 0.32.0 saves
its compiled code again at a start that found it, and fails to start over a read-only folder), so
its files are copied into ``engine_dir`` by a child process that is the engine's user, unless
``engine_dir`` holds the marker of this key and manifest already (``.kimi-compile-cache``).

Exit 0 with one JSON line once ``dir`` holds exactly the manifest and the engine its copy;
weights_sync's exit status and line otherwise (4: a file still does not match, 5: no peer gave it,
6: a name leaves the folder); 7 when the copy into ``engine_dir`` failed.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sys
from typing import Any

from kimi_deploy.hostside import weights_sync
from kimi_deploy.hostside.compile_cache_found import MARKER, manifest_digest
from kimi_deploy.hostside.compile_cache_pack import DIR_MODE, FILE_MODE, MANIFEST
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.revision_files import META, meta

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import CompileCachePlaceRequest, SyncRequest


def placed(root: str, manifest: dict[str, Any]) -> bool:
    """Whether ``root`` holds ``manifest`` as the artifact's own record."""
    try:
        with open(meta(root, MANIFEST), encoding="utf-8") as f:
            return bool(json.load(f) == manifest)
    except (OSError, ValueError):
        return False


def place(req: CompileCachePlaceRequest) -> dict[str, Any]:
    root, manifest = req["dir"], req["manifest"]
    whole = os.path.isdir(root) and placed(root, manifest)
    _placed(req)
    given = _give(req)
    return {"dir": root, "files": len(manifest), "already": whole, "given": given}


def _placed(req: CompileCachePlaceRequest) -> None:
    """``dir`` holding exactly the manifest, fetched from the peers where it does not."""
    root, manifest = req["dir"], req["manifest"]
    work = root if os.path.isdir(root) else f"{root}.placing"
    sync: SyncRequest = {
        "repo": f"compile-cache/{os.path.basename(root)}",
        "revision": os.path.basename(root).rsplit("-", 1)[-1],
        "dir": work,
        "lock": manifest,
        "endpoint": None,
        "token_file": None,
        "retries": 2,
        "progress_log": req["progress_log"],
        "peers": req.get("peers") or [],
        "peer_key_file": req.get("peer_key_file"),
        "hub": False,
    }
    os.makedirs(os.path.dirname(root), mode=DIR_MODE, exist_ok=True)
    weights_sync.check_request(sync)
    with weights_sync._exclusive(work):  # the sync's own lock on the folder
        weights_sync.sync(sync)  # exits with its status and line on a failure
    record = meta(work, MANIFEST)
    tmp = f"{record}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, sort_keys=True)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, record)
    for parent, dirs, _ in os.walk(work):
        for name in dirs:
            os.chmod(os.path.join(parent, name), DIR_MODE)
    os.chmod(work, DIR_MODE)
    if work != root:
        os.replace(work, root)
    shutil.rmtree(os.path.join(root, META, "partial"), ignore_errors=True)


def _give(req: CompileCachePlaceRequest) -> bool:
    """The artifact's files copied into the engine's own cache folder, by the engine's user: what
    root writes there is only the folder systemd would make (``owner_root``, the unit's cache
    folder, 0700), so no link the engine left in its folder can lead root anywhere. False when the
    folder already holds this manifest of this key (its marker), True when copied."""
    root, manifest, target = req["dir"], req["manifest"], req["engine_dir"]
    marker = {"key": os.path.basename(root), "manifest": manifest_digest(manifest)}
    user = pwd.getpwnam(req["user"])
    owner_root = req["owner_root"]
    if not os.path.lexists(owner_root):
        os.makedirs(os.path.dirname(owner_root), mode=DIR_MODE, exist_ok=True)
        os.mkdir(owner_root, 0o700)
        os.chown(owner_root, user.pw_uid, user.pw_gid)
    child = os.fork()
    if child == 0:  # the engine's user from here on
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.umask(0o077)
            code = 0 if _copied(root, manifest, target, marker) else 3
        except BaseException as exc:  # noqa: BLE001 - said in one line, the parent exits with it
            print(f"kimi-deploy: compile cache {root}: into {target}: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 3):
        print(json.dumps({"error": "give", "dir": root, "engine_dir": target}))
        sys.exit(7)
    return code == 0


def _copied(root: str, manifest: dict[str, Any], target: str, marker: dict[str, str]) -> bool:
    """Copy every file of ``manifest`` from ``root`` into ``target`` (this process is the engine's
    user), then the marker; False when the marker says it is there already."""
    mark = os.path.join(target, MARKER)
    try:
        with open(mark, encoding="utf-8") as f:
            if json.loads(f.read(4096)) == marker:
                return False
    except (OSError, ValueError):
        pass
    for rel in sorted(manifest):
        dst = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = f"{dst}.kimi-copy"
        with open(os.path.join(root, rel), "rb") as src, open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(tmp, dst)
    with open(f"{mark}.tmp", "w", encoding="utf-8") as f:
        json.dump(marker, f, sort_keys=True)
    os.replace(f"{mark}.tmp", mark)
    return True


def main() -> None:
    req = read_request()
    old = os.umask(0o022)
    try:
        answer = place(req)
    finally:
        os.umask(old)
    print(json.dumps(answer, sort_keys=True), file=sys.stdout)


if __name__ == "__main__":
    main()
