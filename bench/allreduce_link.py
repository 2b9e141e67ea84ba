"""The all-reduce check against the link it runs over, on 2 real hosts of a cluster of its own.

    python bench/allreduce_link.py [--runs 3] [--max-mib 64]

Brings up 2 hosts (10.213.15.0/24), converges an SGLang instance over both with torch 2.13.0 (CPU
build) pinned in its release, then, in the same run, measures best of ``--runs``:
- the TCP rate between the hosts, with the communication check's own bandwidth test
  (``hostside/commcheck.py``), the number ``comm_check.min_mbit_s`` is compared with;
- the all-reduce check (``hostside/allreduce.py`` with the release's python, as the engine user,
  gloo, one rank per host), its bus bandwidth at each size and the seconds it takes in all.
With 2 ranks busbw equals algbw and each rank sends and receives the whole buffer once, so the
bus bandwidth at the largest size should approach the link's rate; the ratio says how close.
Takes the cluster down at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.demo_recipes import recipe_for
from harness.own_cluster import OwnCluster
from harness.ssh import root_ssh
from kimi_deploy.host.command import hostside_command

ROOT = Path(__file__).resolve().parent.parent


BENCH = OwnCluster(
    {
        "KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-bench-ar",
        "KIMI_CLUSTER_SUBNET": "10.213.15.0/24",
        "KIMI_CLUSTER_PACKAGES": "torch==2.13.0+cpu",
    }
)
PYTHON = "/opt/kimi/current/engine/bin/python"


def both(state: dict[str, Any], commands: list[str]) -> list[dict[str, Any]]:
    """Each host's command at the same moment; each one's last stdout line, as JSON."""
    procs = []
    for host, command in zip(state["hosts"], commands, strict=True):
        argv = [*root_ssh(state, host["address"]), command]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode != 0:
            sys.exit(f"bench: {stderr.strip()[-800:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def link_mbit_s(state: dict[str, Any], size: int) -> float:
    hosts = state["hosts"]
    token = f"bench{time.monotonic_ns()}"
    commands = []
    for me in hosts:
        request = {
            "run": token,
            "me": me["name"],
            "address": me["address"],
            "port": 29599,
            "listen": [],
            "peers": [{"host": h["name"], "address": h["address"], "ports": []} for h in hosts if h is not me],
            "bandwidth": {"bytes": size, "min_mbit_s": 1, "max_s": 10.0},
            "deadline_s": 30,
        }
        commands.append(hostside_command("python3", "commcheck.py", request))
    rates = [p["mbit_s"] for r in both(state, commands) for p in r["pairs"] if p["kind"] == "bandwidth"]
    return float(min(rates))


def all_reduce(state: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    hosts = state["hosts"]
    commands = []
    for me in hosts:
        request = {
            "run": "bench",
            "label": "demo-ar/serve#0",
            "me": me["name"],
            "address": me["address"],
            "backend": "gloo",
            "rendezvous": {"address": hosts[0]["address"], "port": 29498},
            "hosts": [{"host": h["name"], "address": h["address"], "ranks": 1} for h in hosts],
            "min_bytes": 2**20,
            "max_bytes": max_bytes,
            "warmup_iters": 2,
            "iters": 10,
            "deadline_s": 120,
            "min_busbw_gbs": 0.001,
            "env": {},
        }
        drop = "setpriv --reuid=kimi --regid=kimi --init-groups --reset-env"
        commands.append(f"{drop} {hostside_command(PYTHON, 'allreduce.py', request)}")
    first, second = both(state, commands)
    assert first["rows"] == second["rows"], "the ranks disagree"
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-mib", type=int, default=64)
    args = parser.parse_args()
    BENCH.cli("down")
    BENCH.cli("up", "--hardware", "b300x8,b300x8")
    try:
        state = BENCH.state()
        folder = Path(tempfile.mkdtemp(prefix="bench-ar-"))
        recipe = recipe_for(BENCH, folder, 0.001)
        run = BENCH.pyinfra(BENCH.inventory(folder / "ar.py", recipe, "demo_ar = _hosts"))
        if run.code != 0:
            sys.exit(f"bench: converge failed\n{run.log[-3000:]}")
        size = args.max_mib * 2**20
        link = max(link_mbit_s(state, size) for _ in range(args.runs))
        results = [all_reduce(state, size) for _ in range(args.runs)]
        best = max(results, key=lambda r: r["rows"][-1]["busbw_gbs"])
        print(f"TCP between the hosts (comm check, {args.max_mib} MiB): {link:.0f} Mbit/s = {link / 8000:.3f} GB/s")
        print(f"all-reduce, gloo, 2 ranks, torch {best['torch']}, best of {args.runs}:")
        print(f"{'size':>8} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} {'wrong':>6}")
        for row in best["rows"]:
            print(
                f"{row['size_bytes'] >> 20:>5} MiB {row['time_us']:>10.0f} {row['algbw_gbs']:>11.3f} "
                f"{row['busbw_gbs']:>11.3f} {row['wrong']:>6}"
            )
        ratio = best["rows"][-1]["busbw_gbs"] / (link / 8000)
        print(f"busbw at {args.max_mib} MiB / TCP rate: {ratio:.2f}")
        seconds = sorted(r["seconds"] for r in results)
        print(f"the check's own time (torch import, rendezvous, all sizes): {', '.join(f'{s:.2f}' for s in seconds)} s")
    finally:
        BENCH.cli("down")


if __name__ == "__main__":
    main()
