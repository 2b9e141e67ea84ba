"""Place the compile cache of a key on this host, from a host of the run that packed it.

Run as root with the host's python3. Input: one argument, base64 of zlib-compressed JSON:
{"dir": the artifact folder (``kimi_deploy.compile_cache.key``), "manifest": {path: [size,
"sha256:<hex>"]}: the controller's, "peers": [{"host", "url"}], "peer_key_file", "progress_log"}.

The files come through the weights' relay (weights_sync.py fetching from weights_peer.py, with
the run's transfer key), each hashed as it arrives and kept only when it matches the manifest the
controller holds; nothing comes from the Hub (``"hub": false``). A first placement is made in
``<dir>.placing`` and renamed to ``dir`` once whole, so a unit binding ``dir`` never sees a part; a
folder already in place is verified (a file changed since its verdict is hashed again), and what
does not match is fetched again, what the manifest does not name is removed. Then
``.kimi/manifest.json`` holds the manifest, and every file is root's, 0644.

Exit 0 with one JSON line once ``dir`` holds exactly the manifest; weights_sync's exit status and
line otherwise (4: a file still does not match, 5: no peer gave it, 6: a name leaves the folder).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any

from kimi_deploy.hostside import weights_sync
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
    return {"dir": root, "files": len(manifest), "already": whole}


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
