"""Time the communication check on 2, 3 and 4 real hosts of the demo cluster, all hosts at once.

    python bench/commcheck_hosts.py [--ports 4] [--bytes 8388608]

Needs the demo cluster up (scripts/demo). Each host listens on ``--ports`` ports and must reach
every port of every other host, plus the check's own port with a bounded bandwidth test, exactly
as ``deploys/kimi.py`` runs ``hostside/commcheck.py`` before engines of a multi-host topology
(re)start; each host is started over its own SSH connection at the same moment. Pairs grow with
the square of the hosts; the time should not, because every host probes its peers in parallel.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.ssh import root_ssh
from kimi_deploy.host.command import hostside_command
from localcluster.state import Settings

ROOT = Path(__file__).resolve().parent.parent


def run_check(state: dict[str, Any], hosts: list[dict[str, Any]], ports: int, size: int) -> tuple[float, list[int]]:
    token = f"bench{time.monotonic_ns()}"
    listen = [{"port": 29600 + i, "label": f"rank port {i}"} for i in range(ports)]

    def one(me: dict[str, Any]) -> int:
        request = {
            "run": token,
            "me": me["name"],
            "address": me["address"],
            "port": 29599,
            "listen": listen,
            "peers": [{"host": h["name"], "address": h["address"], "ports": listen} for h in hosts if h is not me],
            "bandwidth": {"bytes": size, "min_mbit_s": 1, "max_s": 2.0},
            "deadline_s": 20,
        }
        ssh = root_ssh(state, me["address"])
        done = subprocess.run(
            [*ssh, hostside_command("python3", "commcheck.py", request)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"{me['name']}: {done.stderr.strip()[-500:]}")
        return len(json.loads(done.stdout.splitlines()[-1])["pairs"])

    started = time.perf_counter()
    with ThreadPoolExecutor(len(hosts)) as pool:
        pairs = list(pool.map(one, hosts))
    return time.perf_counter() - started, pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ports", type=int, default=4, help="ports each host listens on")
    parser.add_argument("--bytes", type=int, default=8 << 20, help="bandwidth test size per pair")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    state = json.loads((Settings.from_env().state_dir / "state.json").read_text(encoding="utf-8"))
    print(f"{'hosts':>5} {'host pairs':>10} {'probes':>7} {'best s':>7} {'ratio':>6}")
    base = None
    for n in (2, 3, 4):
        hosts = state["hosts"][:n]
        best = min(run_check(state, hosts, args.ports, args.bytes)[0] for _ in range(args.runs))
        _, pairs = run_check(state, hosts, args.ports, args.bytes)
        base = base or best
        print(f"{n:5d} {n * (n - 1):10d} {sum(pairs):7d} {best:7.2f} {best / base:6.2f}")


if __name__ == "__main__":
    main()
