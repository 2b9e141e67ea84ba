"""What a converge's probe costs each host in CPU: the exact command a converge sends it
(``facts.host_state.KimiHostState`` with the request ``deploys/kimi.py`` sends), run there
``KIMI_BENCH_PROBE_RUNS`` times in a row (default 5) under a small Python that reads, for each
run, the user and system time of the probe's python3 and every process it started (``wait4``).
Changes nothing. Each host's times, in milliseconds, are appended as one JSON line
``{"host": name, "ms": [...]}`` to the file ``KIMI_BENCH_PROBE_CPU`` names (``bench/fleet.py``).

Measured apart from the timed runs, so that the wrapper costs neither the no-op nor the floor.
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from pyinfra.api.facts import FactBase
from pyinfra.context import host

from kimi_pyinfra.converge_run import probe_request
from kimi_pyinfra.facts.host_state import KimiHostState

# argv: runs, then the probe's command as its words (python3 -c ...): each run's CPU, in ms
TIMER = """
import os, subprocess, sys
runs, argv, ms = int(sys.argv[1]), sys.argv[2:], []
for _ in range(runs):
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    ms.append(round((usage.ru_utime + usage.ru_stime) * 1000, 2))
print(ms)
"""


class ProbeCpu(FactBase[list[float]]):
    """Each run's CPU, in ms, of ``probe`` (a shell command) run ``runs`` times on the host."""

    def requires_command(self, *args: Any, **kwargs: Any) -> str:
        return "python3"

    def command(self, probe: str, runs: int) -> str:
        return f"python3 -c {shlex.quote(TIMER)} {int(runs)} {probe}"

    def process(self, output: list[str]) -> list[float]:
        found: list[float] = json.loads(output[-1])
        return found


probe = KimiHostState().command(**probe_request(host))
ms = host.get_fact(ProbeCpu, probe=probe, runs=int(os.environ.get("KIMI_BENCH_PROBE_RUNS", "5")))
with open(os.environ["KIMI_BENCH_PROBE_CPU"], "a", encoding="utf-8") as out:
    out.write(json.dumps({"host": host.name, "ms": ms}) + "\n")
