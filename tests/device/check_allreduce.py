"""Run ``hostside/allreduce.py`` with NCCL over every GPU of this machine and check what it reports.

Needs torch with CUDA (``--python`` names the interpreter, default this one). One host, one rank
per GPU: every size all-reduced without a wrong value, a positive algorithm bandwidth, the NCCL
version named. With one GPU the bus bandwidth is 0 by definition (2(n-1)/n), so the verdict must be
exactly the bus bandwidth line; with more it must pass ``--min-busbw``. Exit 0 when all holds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kimi_deploy.host.command import hostside_command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--min-busbw", type=float, default=1.0, help="GB/s, with two GPUs or more")
    parser.add_argument("--max-bytes", type=int, default=2**30)
    args = parser.parse_args()
    count = subprocess.run(
        [args.python, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    gpus = int(count)
    if gpus == 0:
        print(f"check_allreduce: {args.python}'s torch sees no CUDA device", file=sys.stderr)
        return 2
    request = {
        "run": "device",
        "label": "device/serve#0",
        "me": "device",
        "address": "127.0.0.1",
        "backend": "nccl",
        "rendezvous": {"address": "127.0.0.1", "port": 29498},
        "hosts": [{"host": "device", "address": "127.0.0.1", "ranks": gpus}],
        "min_bytes": 2**20,
        "max_bytes": args.max_bytes,
        "warmup_iters": 5,
        "iters": 20,
        "deadline_s": 120,
        "min_busbw_gbs": args.min_busbw,
        "env": {},
    }
    run = subprocess.run(
        hostside_command(args.python, "allreduce.py", request),
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(run.stdout.strip())
    result = json.loads(run.stdout)
    problems = []
    if not result.get("rows"):
        problems.append(f"no rows: {result.get('failure')}")
    if any(r["wrong"] for r in result["rows"]) or any(r["algbw_gbs"] <= 0 for r in result["rows"]):
        problems.append("a wrong value or no bandwidth")
    if not result.get("nccl"):
        problems.append("no NCCL version")
    if gpus == 1:
        if run.returncode != 1 or "): bus bandwidth 0 GB/s at " not in (result.get("failure") or ""):
            problems.append(f"one GPU: expected the bus bandwidth verdict, found {result.get('failure')}")
    elif run.returncode != 0:
        problems.append(f"{gpus} GPUs: {result.get('failure')}")
    for problem in problems:
        print(f"check_allreduce: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
