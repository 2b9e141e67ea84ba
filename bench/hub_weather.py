"""The weights sync through the Hub's weather: what rate limits, server errors and dropped transfers
cost, against clear weather measured in the same run.

    python bench/hub_weather.py [--shards 96] [--mib 2] [--mbyte-per-s 8]

The fake Hub (``localcluster.hub``) on loopback serves a revision of N shards of S MiB, each body at
``--mbyte-per-s`` (a link's pace: eight at once, as the sync takes them); ``hostside/weights_sync.py``
(bundled, as a host runs it, with the real huggingface_hub client) syncs it into an empty folder
once per weather:

* clear: no fault;
* 429 storm: every shard's metadata answered 429 with ``Retry-After: 1`` once (the Hub's rate limit);
* 503s: every shard's bytes answered 503 once;
* resets: every shard's transfer reset halfway once, resumed with Range;
* resets, no Range: the same with a source that answers a Range with the whole body, so each
  shard starts over: what a client without resume pays.

Prints, per weather: seconds and their ratio to clear, the retries the progress log counted, and
the bytes the Hub sent over the revision's size (1.00: nothing sent twice).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kimi_deploy.host.command import bundle, pack
from localcluster.hub import serve, write_faults
from localcluster.hub_repo import Commit, write_repo

REPO = "bench/weather"


def _repo(root: Path, shards: int, mib: int) -> tuple[str, dict[str, list[Any]]]:
    names = [f"model-{n:05d}-of-{shards:05d}.safetensors" for n in range(1, shards + 1)]
    files: dict[str, Any] = {name: (lambda: iter([os.urandom(mib << 20)])) for name in names}
    files["config.json"] = b'{"model_type": "bench"}\n'
    info = write_repo(
        root,
        REPO,
        [Commit("a", 1767225600, "weights", files)],
        branches={"main": "a"},
        tags={},
        build={"bench": time.time()},
        model_info={},
    )
    commit = info.commits["a"]
    lock = {
        path: [e.size, f"sha256:{e.sha256}" if e.is_lfs else f"gitblob:{e.git_blob_sha1}"]
        for path, e in info.files[commit].items()
    }
    return commit, lock


def _weathers(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each weather's faults.json: a rule per shard, so that each fails once."""

    def each(**rule: Any) -> list[dict[str, Any]]:
        return [{"path": name, "times": 1, **rule} for name in names]

    return {
        "clear": {},
        "429 storm": {"fail": each(method="HEAD", status=429, retry_after=1)},
        "503s": {"fail": each(method="GET", status=503)},
        "resets": {"fail": each(method="GET", reset_at=0.5)},
        "resets, no Range": {"fail": each(method="GET", reset_at=0.5), "whole": names},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=96)
    parser.add_argument("--mib", type=int, default=2)
    parser.add_argument("--mbyte-per-s", type=float, default=8.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hub-weather-") as tmp:
        work = Path(tmp)
        commit, lock = _repo(work / "hub", args.shards, args.mib)
        size = sum(entry[0] for entry in lock.values())
        program = work / "weights_sync.py"
        program.write_text(bundle("weights_sync.py"), encoding="utf-8")
        hub = serve(work / "hub", "127.0.0.1", 0, log_stream=None)
        rows = []
        try:
            shards = sorted(name for name in lock if name.startswith("model-"))
            for name, faults in _weathers(shards).items():
                write_faults(work / "hub", {**faults, "slow_bytes_per_s": int(args.mbyte_per_s * 1e6)})
                hub.stats.reset()
                # A parent of its own: the sync would link the files of a sibling revision folder.
                folder = work / name.replace(" ", "-").replace(",", "") / commit
                request = {
                    "repo": REPO,
                    "revision": commit,
                    "dir": str(folder),
                    "lock": lock,
                    "endpoint": hub.url,
                    "token_file": None,
                    "retries": 2,
                    "progress_log": str(folder) + ".log",
                }
                started = time.monotonic()
                done = subprocess.run(
                    [sys.executable, str(program), pack(request)], capture_output=True, text=True, check=False
                )
                seconds = time.monotonic() - started
                if done.returncode != 0:
                    sys.exit(f"{name}: the sync failed ({done.returncode}): {done.stderr.strip()[-500:]}")
                result = json.loads(done.stdout.splitlines()[-1])
                sent = sum(hub.stats.snapshot()["bytes"].values())
                rows.append((name, seconds, sum(result["hub_retries"].values()), sent / size))
        finally:
            hub.stop()
    clear = rows[0][1]
    print(
        f"{args.shards} shards x {args.mib} MiB ({size / 2**20:.0f} MiB), each body at {args.mbyte_per_s} MB/s, "
        "8 at once"
    )
    print(f"{'weather':18} {'seconds':>8} {'x clear':>8} {'retries':>8} {'sent/size':>10}")
    for name, seconds, retries, ratio in rows:
        print(f"{name:18} {seconds:8.1f} {seconds / clear:8.2f} {retries:8d} {ratio:10.2f}")


if __name__ == "__main__":
    main()
