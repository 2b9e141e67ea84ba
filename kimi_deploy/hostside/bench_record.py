"""The serving benchmark's figures put in the release record of the host that ran it.

Request (JSON, zlib, base64 in argv): ``{"figures": {...}, "current": "/opt/kimi/current",
"releases": "/opt/kimi/releases"}``. The release serving is where ``current`` points, resolved and
kept inside ``releases`` (a link pointing elsewhere writes no record there). Its folder gets
``bench.json``; ``/var/lib/kimi/bench-history.json`` keeps the last runs of every release. Prints
``{"release": NAME, "before": ENTRY}``: ``before`` is the latest run of another release, the one
this release replaced or an earlier one, for the controller to print the difference (None when
there is none).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.whole_file import write_whole

HISTORY = f"{STATE_DIR}/bench-history.json"
KEEP = 50


def serving_release(current: str, releases: str) -> str | None:
    """The folder ``current`` points to when it is one directly inside ``releases``, else None."""
    target, root = os.path.realpath(current), os.path.realpath(releases)
    if os.path.dirname(target) != root or not os.path.isdir(target):
        return None
    return target


def record(req: dict[str, Any]) -> dict[str, Any]:
    folder = serving_release(req["current"], req["releases"])
    name = os.path.basename(folder) if folder else None
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entry = {"release": name, "at": stamp, "figures": req["figures"]}
    if folder:
        write_whole(os.path.join(folder, "bench.json"), json.dumps(entry, sort_keys=True) + "\n", 0o644)
    try:
        with open(HISTORY, encoding="utf-8") as f:
            kept = json.load(f).get("runs", [])
        kept = [e for e in kept if isinstance(e, dict)] if isinstance(kept, list) else []
    except (OSError, ValueError, AttributeError):
        kept = []
    before = next((e for e in reversed(kept) if e.get("release") not in (None, name)), None)
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    write_whole(HISTORY, json.dumps({"runs": [*kept, entry][-KEEP:]}, sort_keys=True) + "\n", 0o644)
    return {"release": name, "before": before}


def main() -> None:
    req = read_request()
    print(json.dumps(record(req), sort_keys=True))


if __name__ == "__main__":
    main()
