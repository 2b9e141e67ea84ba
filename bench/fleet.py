"""Converge a fleet of N hosts from one controller: first converge, the Hub's counter, no-op / floor.

    python bench/fleet.py [--hosts 4 16 64] [--runs 3] [--keep]

Root only. For each N, a cluster of its own (``/var/lib/kimi-cluster-fleet``) with N hosts and
recipes/demo-gpu.yaml grown to them (``harness.fleet``): vLLM stand-ins on all but the last
hosts, one SGLang instance across the last 2 (N <= 8) or 4. Prints, per N: ``cluster up`` time,
the first converge's time and errors, how many instances answer a chat request, the most bodies
the Hub sent of any one file (1: each file once for the whole run), the median no-op re-run and
the median floor (connect to every host and read one fact: bench/floor.py) measured in the same
run, and their ratio; then the median of a run that reads only the converge's own probe
(bench/probe_floor.py: the floor with the probe as its one fact), the no-op's ratio to it, the
controller's CPU seconds for the no-op and for the floor, and the whole machine's (the
controller's and every host's: they share its cores), with the least wall time the no-op's CPU
takes on those cores and its ratio to the floor: on this one machine the no-op / floor cannot go
below it, whatever the controller does.

Then one table, a row per N as it is measured and the whole table at the end, on stdout (the
line above goes to stderr): the controller's own CPU seconds per host for the no-op re-run and
for the floor (pyinfra's user + system time, with everything it started, over N; median of the
runs), their ratio (target <= 1.5), each host's probe CPU in ms (target <= 60: the converge's
exact probe command, run 5 times on every host after the timed runs, bench/probe_cpu.py; the
median of all those runs, and the highest host's median), and the wall times of the no-op and
the floor.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.bytecode import compiled
from harness.fleet import (
    FLEET,
    answers,
    bodies_served,
    endpoints,
    failed,
    fleet_arguments,
    for_each_size,
    hub,
    inventory,
    timed,
)


def cold_start_table(log: str) -> list[str]:
    """The cold-start headline and table in a run's log (up to the first line after it that is no row)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines()
    at = next((i for i, line in enumerate(lines) if "--> Cold start:" in line), None)
    if at is None:
        return []
    table = [lines[at].strip(), lines[at + 1].rstrip()] if at + 1 < len(lines) else [lines[at].strip()]
    for line in lines[at + 2 :]:
        if not re.match(r"\s+(kimi-h\d+|median/max)", line):
            break
        table.append(line.rstrip())
    return table


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
    for name, hosts in errors.items():
        print(f"N={n}: first converge: {name!r} failed on {', '.join(hosts)}", flush=True)
    # the first converge's cold start broken down, as the run printed it (kimi_pyinfra.cold_start)
    for line in cold_start_table(first.log):
        print(f"N={n}: {line}", file=sys.stderr, flush=True)
    if first.code != 0:
        print(f"N={n}: {failed('first converge', first.log).splitlines()[0]}", flush=True)
        # converge the rest before timing a no-op
        timed(FLEET, inv)
    noop, floor, probe, noop_cpu, floor_cpu, noop_all, floor_all = [], [], [], [], [], [], []
    for _ in range(runs):
        cpu, machine = _children_cpu(), _machine_cpu()
        run, seconds = timed(FLEET, inv)
        noop_cpu.append(_children_cpu() - cpu)
        noop_all.append(_machine_cpu() - machine)
        if run.code != 0 or run.changed():
            sys.exit(f"N={n}: the re-run was not a no-op: {run.changed()}; {failed('re-run', run.log)}")
        noop.append(seconds)
        cpu, machine = _children_cpu(), _machine_cpu()
        run, seconds = timed(FLEET, inv, deploy="bench/floor.py")
        floor_cpu.append(_children_cpu() - cpu)
        floor_all.append(_machine_cpu() - machine)
        floor.append(seconds)
        run, seconds = timed(FLEET, inv, deploy="bench/probe_floor.py")
        if run.code != 0:
            sys.exit(f"N={n}: {failed('probe alone', run.log)}")
        probe.append(seconds)
    probe_ms = _probe_cpu(inv)
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
        "probe_s": statistics.median(probe),
        "noop_cpu_s": statistics.median(noop_cpu),
        "floor_cpu_s": statistics.median(floor_cpu),
        "noop_all_s": statistics.median(noop_all),
        "floor_all_s": statistics.median(floor_all),
        "probe_ms": statistics.median(ms for runs in probe_ms.values() for ms in runs),
        "probe_ms_worst": max(statistics.median(runs) for runs in probe_ms.values()),
        "probe_hosts": len(probe_ms),
    }


def _probe_cpu(inv: Path) -> dict[str, list[float]]:
    """Each host's probe CPU, in ms, for each of 5 runs of the converge's exact probe command
    (bench/probe_cpu.py): a measured step apart from the timed runs."""
    with tempfile.NamedTemporaryFile("r", prefix="kimi-fleet-probe-cpu-", suffix=".jsonl") as out:
        os.environ["KIMI_BENCH_PROBE_CPU"] = out.name
        run, _ = timed(FLEET, inv, deploy="bench/probe_cpu.py")
        if run.code != 0:
            sys.exit(f"probe CPU: {failed('probe CPU', run.log)}")
        rows = [json.loads(line) for line in out.read().splitlines() if line.strip()]
    return {row["host"]: row["ms"] for row in rows}


def _machine_cpu() -> float:
    """CPU seconds this whole machine has spent busy since boot (every core, ``/proc/stat``): the
    controller and every host, whose processes all run on its cores."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:8]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children: the controller's pyinfra
    (``getrusage``: microseconds, where ``os.times`` counts clock ticks of 10 ms)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


HEADER = (
    f"{'hosts':>5}  {'ctl CPU/host no-op':>18}  {'floor':>8}  {'ratio':>5}  "
    f"{'probe CPU/host (median, worst host)':>35}  {'wall no-op':>10}  {'floor':>6}"
)


def line(n: int, runs: int, folder: Path) -> str:
    """The table's row for ``n`` hosts (stdout); the figures behind it on one line on stderr."""
    row = one(n, runs, folder)
    print(_details(row), file=sys.stderr, flush=True)
    noop_cpu, floor_cpu = float(row["noop_cpu_s"]), float(row["floor_cpu_s"])  # type: ignore[arg-type]
    probe = f"{row['probe_ms']:.1f} ms, {row['probe_ms_worst']:.1f} ms ({row['probe_hosts']} hosts)"
    return (
        f"{n:>5}  {noop_cpu / n:>16.3f} s  {floor_cpu / n:>6.3f} s  {noop_cpu / floor_cpu:>5.2f}  "
        f"{probe:>35}  {row['noop_s']:>8.2f} s  {row['floor_s']:>4.2f} s"
    )


def _details(row: dict[str, object]) -> str:
    cores = os.cpu_count() or 1
    noop, floor, probe = float(row["noop_s"]), float(row["floor_s"]), float(row["probe_s"])  # type: ignore[arg-type]
    # The least wall time the no-op's CPU (controller and hosts alike) takes on this machine's cores.
    least = float(row["noop_all_s"]) / cores  # type: ignore[arg-type]
    return (
        f"N={row['hosts']:>3}  up {row['up_s']:6.1f} s  first converge {row['first_s']:6.1f} s "
        f"rc {row['first_rc']} errors {row['op_errors']}  answering {row['answering']}  "
        f"Hub: {row['files']} files, at most {row['max_bodies']} bodies each  "
        f"no-op {noop:.2f} s  floor {floor:.2f} s  ratio {noop / floor:.2f}  "
        f"probe alone {probe:.2f} s  no-op / probe alone {noop / probe:.2f}  "
        f"controller CPU no-op {row['noop_cpu_s']:.2f} s floor {row['floor_cpu_s']:.2f} s  "
        f"machine CPU no-op {row['noop_all_s']:.2f} s floor {row['floor_all_s']:.2f} s: "
        f"the no-op needs at least {least:.2f} s on {cores} cores ({least / floor:.2f} x the floor)"
    )


def main() -> None:
    args = fleet_arguments(__doc__.splitlines()[0])
    # Time the deploy as an install runs it: its modules compiled (harness.bytecode).
    compiled()
    rows: list[str] = []

    def measure(n: int, folder: Path) -> str:
        rows.append(line(n, args.runs, folder))
        return rows[-1]

    print(HEADER, flush=True)
    for_each_size(args, measure, fresh=True)
    # the whole table again, together: ``cluster up`` prints its hosts between the rows above
    print("\n".join([HEADER, *rows]), flush=True)


if __name__ == "__main__":
    main()
