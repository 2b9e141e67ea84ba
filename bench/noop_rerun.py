"""Time a no-op re-run of deploys/kimi.py on the demo cluster against the floor, in one run.

    python bench/noop_rerun.py [--runs N]

Needs a converged demo cluster (scripts/demo). Prints the median and spread of each and their
ratio; the target is a ratio of 3 or less.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.bytecode import compiled

ROOT = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def timed(deploy: str) -> float:
    started = time.perf_counter()
    run = subprocess.run(
        [PYINFRA, "inventories/demo.py", deploy, "-y"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if run.returncode != 0:
        sys.exit(f"{deploy} failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return elapsed


def changed_ops(deploy: str) -> str:
    """The Grand total row's Success column of a run: ``-`` when nothing changed."""
    run = subprocess.run(
        [PYINFRA, "inventories/demo.py", deploy, "-y"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    total = next(line for line in (run.stdout + run.stderr).splitlines() if "Grand total" in line)
    return total.split()[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    # As an install runs the deploy: its modules compiled (harness.bytecode).
    compiled()
    # Converge first, then check that a re-run is a no-op: only then is the timing the no-op's.
    timed("deploys/kimi.py")
    if changed_ops("deploys/kimi.py") != "-":
        sys.exit("a re-run of deploys/kimi.py changed something: not a no-op, nothing to time")
    floor, noop = [], []
    for _ in range(args.runs):
        # Interleaved, so that load on this shared machine hits both alike.
        floor.append(timed("bench/floor.py"))
        noop.append(timed("deploys/kimi.py"))
    f, n = statistics.median(floor), statistics.median(noop)
    print(f"floor (connect + one fact), 4 hosts: median {f:.2f} s (min {min(floor):.2f}, max {max(floor):.2f})")
    print(f"no-op re-run of deploys/kimi.py, 4 hosts: median {n:.2f} s (min {min(noop):.2f}, max {max(noop):.2f})")
    print(f"ratio no-op / floor: {n / f:.2f} (target <= 3)")


if __name__ == "__main__":
    main()
