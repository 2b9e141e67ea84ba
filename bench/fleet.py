"""Converge a fleet of N hosts from one controller: first converge, the Hub's counter, no-op / floor.

    python bench/fleet.py [--hosts 4 16 64] [--runs 3] [--keep]

Root only. For each N, a cluster of its own (``/var/lib/kimi-cluster-fleet``) with N hosts and
recipes/demo-gpu.yaml grown to them (``harness.fleet``): vLLM stand-ins on all but the last
hosts, one SGLang instance across the last 2 (N <= 8) or 4. Prints, per N: ``cluster up`` time,
the first converge's time and errors, how many instances answer a chat request, the most bodies
the Hub sent of any one file (1: each file once for the whole run), the median no-op re-run and
the median floor (connect to every host and read one fact: bench/floor.py) measured in the same
run, and their ratio.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.fleet import (
    FLEET,
    answers,
    bodies_served,
    endpoints,
    fleet_arguments,
    for_each_size,
    hub,
    inventory,
    timed,
)


def one(n: int, runs: int, folder: Path) -> dict[str, object]:
    started = time.perf_counter()
    FLEET.cli("up", "--hosts", str(n))
    up_s = time.perf_counter() - started
    inv = inventory(FLEET, folder, n)
    hub(FLEET, "/_stats/reset", "POST")
    first, first_s = timed(FLEET, inv)
    errors = first.errors() if first.payload else {"(no JSON)": [first.log[-300:]]}
    served = bodies_served(FLEET)
    answering = sum(answers(FLEET, e) for e in endpoints(FLEET, n))
    for name, failed in errors.items():
        print(f"N={n}: first converge: {name!r} failed on {', '.join(failed)}", flush=True)
    if first.code != 0:
        # converge the rest before timing a no-op
        timed(FLEET, inv)
    noop, floor = [], []
    for _ in range(runs):
        run, seconds = timed(FLEET, inv)
        if run.code != 0 or run.changed():
            sys.exit(f"N={n}: the re-run was not a no-op: {run.changed() or run.log[-1500:]}")
        noop.append(seconds)
        run, seconds = timed(FLEET, inv, deploy="bench/floor.py")
        floor.append(seconds)
    return {
        "hosts": n,
        "up_s": up_s,
        "first_s": first_s,
        "first_rc": first.code,
        "op_errors": sum(len(v) for v in errors.values()),
        "answering": f"{answering}/{len(endpoints(FLEET, n))}",
        "files": len(served),
        "max_bodies": max(served.values(), default=0),
        "noop_s": statistics.median(noop),
        "floor_s": statistics.median(floor),
    }


def line(n: int, runs: int, folder: Path) -> str:
    row = one(n, runs, folder)
    return (
        f"N={row['hosts']:>3}  up {row['up_s']:6.1f} s  first converge {row['first_s']:6.1f} s "
        f"rc {row['first_rc']} errors {row['op_errors']}  answering {row['answering']}  "
        f"Hub: {row['files']} files, at most {row['max_bodies']} bodies each  "
        f"no-op {row['noop_s']:.2f} s  floor {row['floor_s']:.2f} s  "
        f"ratio {float(row['noop_s']) / float(row['floor_s']):.2f}"  # type: ignore[arg-type]
    )


def main() -> None:
    args = fleet_arguments(__doc__.splitlines()[0])
    for_each_size(args, lambda n, folder: line(n, args.runs, folder), fresh=True)


if __name__ == "__main__":
    main()
