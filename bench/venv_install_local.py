"""Install time of a small release from a lock, on this machine, no test cluster needed.

    python bench/venv_install_local.py [--runs 5] [--program BUNDLED_FILE ...]

The demo recipe's tools release (huggingface_hub and what it depends on) is served from a local
PEP 503 index (``localcluster.pkgindex``) over the wheels ``localcluster.pypi_mirror`` caches
(downloaded once); uv is bootstrapped once, the lock resolved once (``stage``), then the release is
installed ``--runs`` times from that lock, as every host after the resolver installs it. Prints
each run's wall and CPU seconds (the install and what it starts) and their medians. ``--program``
(repeatable): a bundled ``venv_install.py`` to time instead of this checkout's
(``kimi_deploy.host.command.bundle``); several are timed in turn, run by run, so that a busy
machine weighs on each alike.
"""

from __future__ import annotations

import argparse
import base64
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from kimi_deploy.host.command import bundle
from localcluster import pkgindex, pypi_mirror

ROOT = Path(__file__).resolve().parent.parent


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run(program: Path, request: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """Wall and CPU seconds of one run of ``program``, and its answer."""
    packed = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
    started, cpu = time.perf_counter(), _cpu()
    done = subprocess.run(
        [sys.executable, str(program), packed], capture_output=True, text=True, check=False, timeout=600
    )
    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
    if done.returncode != 0:
        sys.exit(f"venv_install failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return seconds, cpu, json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--program", type=Path, action="append", default=[])
    args = parser.parse_args()
    wanted = pypi_mirror.requirements()
    tools = [r for r in wanted if not r.startswith("uv==")]
    uv_version = next(r for r in wanted if r.startswith("uv==")).split("==")[1]
    with tempfile.TemporaryDirectory(prefix="kimi-venv-bench-") as scratch:
        here = Path(scratch)
        programs: list[Path] = args.program
        if not programs:
            programs = [here / "venv_install.py"]
            programs[0].write_text(bundle("venv_install.py"), encoding="utf-8")
        pypi_mirror.mirror(here / "index/files", wanted=wanted)
        server = pkgindex.serve(here / "index")
        try:
            request: dict[str, Any] = {
                "path": str(here / "tools/release"),
                "requirements": tools,
                "index_url": server.url,
                "marker": {"package": "huggingface_hub", "requirements": tools},
                "uv": {"version": uv_version, "dir": str(here / "uv")},
                "lock": None,
            }
            stage = here / "locks/release@bench.txt"
            seconds, _, _ = _run(programs[0], {**request, "stage": str(stage)})
            print(f"bootstrap uv and resolve: {seconds:.2f} s")
            lock = stage.read_text(encoding="utf-8")
            times: dict[Path, list[tuple[float, float]]] = {program: [] for program in programs}
            for number in range(args.runs):
                for program in programs:
                    shutil.rmtree(here / "tools", ignore_errors=True)
                    seconds, cpu, answer = _run(program, {**request, "lock": {"text": lock}})
                    times[program].append((seconds, cpu))
                    print(
                        f"{program.name} run {number + 1}: {answer['packages']} packages: {seconds:.2f} s, "
                        f"CPU {cpu:.2f} s"
                    )
            for program, got in times.items():
                wall, cpu = statistics.median(t[0] for t in got), statistics.median(t[1] for t in got)
                print(f"{program.name}: median install from a lock {wall:.2f} s, CPU {cpu:.2f} s ({len(got)} runs)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
