"""How the comm check's run time grows with the number of hosts: it should not.

    python bench/commcheck_scaling.py [--hosts 2 4 8] [--repeat 3] [--bytes 4194304]

Simulates each topology on loopback addresses (127.0.0.2, .3, ...), every host listening on two
engine ports and reaching every port of every peer, with a bandwidth test of ``--bytes`` per pair;
all hosts start at once, as pyinfra runs them. Two cases: "fresh" (nothing else on the ports: every
probe takes well under a millisecond) and "serving" (a live service already holds both engine ports
on every host, so every probe of them waits out the 0.5 s hello window: probed one after another,
a host would need (hosts - 1) x 2 x 0.5 s). Prints, per host count, the best wall time over
``--repeat`` runs (from the first start to the last exit, interpreter start-up included), the
slowest host's own figure, the number of probes per host and in all, and the ratio to the
2-host time. Every run must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kimi_deploy.host.command import hostside_command

ROOT = Path(__file__).resolve().parent.parent


CHECK, DIST, NIXL = 21499, 21500, 21501


def _requests(hosts: int, size: int) -> list[dict[str, Any]]:
    ports = [{"port": DIST, "label": "vllm dist-init"}, {"port": NIXL, "label": "nixl"}]
    names = [(f"kimi-h{i + 1}", f"127.0.0.{i + 2}") for i in range(hosts)]
    return [
        {
            "run": f"bench-{hosts}",
            "me": me,
            "address": address,
            "port": CHECK,
            "listen": ports,
            "peers": [{"host": h, "address": a, "ports": ports} for h, a in names if h != me],
            "bandwidth": {"bytes": size, "min_mbit_s": 1, "max_s": 3},
            "deadline_s": 15,
        }
        for me, address in names
    ]


def _hold(requests: list[dict[str, Any]]) -> list[socket.socket]:
    """Listeners that accept (the kernel does) and never say a word, like a serving engine's."""
    held = []
    for request in requests:
        for port in (DIST, NIXL):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((request["address"], port))
            sock.listen(socket.SOMAXCONN)
            held.append(sock)
    return held


def _once(hosts: int, size: int, serving: bool) -> tuple[float, float]:
    requests = _requests(hosts, size)
    commands = [hostside_command(sys.executable, "commcheck.py", r) for r in requests]
    held = _hold(requests) if serving else []
    try:
        started = time.perf_counter()
        procs = [
            subprocess.Popen(c, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # noqa: S602
            for c in commands
        ]
        results = [p.communicate(timeout=60) for p in procs]
        wall = time.perf_counter() - started
    finally:
        for sock in held:
            sock.close()
    slowest = 0.0
    for proc, (out, err) in zip(procs, results, strict=True):
        if proc.returncode != 0:
            raise SystemExit(f"{hosts} hosts: exit {proc.returncode}: {err.strip()}")
        slowest = max(slowest, float(json.loads(out)["seconds"]))
    return wall, slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bytes", type=int, default=4 << 20)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; every simulated host is its own interpreter")
    for case in ("fresh", "serving"):
        base: float | None = None
        print(
            f"{case:>8} {'hosts':>5} {'probes/host':>11} {'probes':>7} {'wall s':>7} {'in-script s':>11} {'ratio':>6}"
        )
        for hosts in args.hosts:
            wall, slowest = min(_once(hosts, args.bytes, case == "serving") for _ in range(args.repeat))
            base = base or wall
            per_host = (hosts - 1) * 4  # two engine ports, the check port, the bandwidth test
            print(
                f"{'':>8} {hosts:>5} {per_host:>11} {per_host * hosts:>7} {wall:>7.3f} {slowest:>11.3f}"
                f" {wall / base:>6.2f}"
            )


if __name__ == "__main__":
    main()
