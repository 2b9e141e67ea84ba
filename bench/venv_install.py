"""Install time of the stand-in vLLM release with uv against pip, and what the probe's damage check costs.

    KIMI_CLUSTER_DIR=/var/lib/kimi-cluster-venv python bench/venv_install.py [--runs 3]

Needs a test cluster (``kimi-deploy cluster up``); works on its first host, in scratch folders
under /var/tmp that it removes. In the same run, ``--runs`` times each, alternating:

- pip: what releases were installed with before uv: ``python3 -m venv`` (which seeds pip) and
  ``pip install --no-cache-dir`` of the pins from the cluster's index;
- uv, resolving: ``hostside/venv_install.py`` resolving the lock and installing it (the first
  host of a release), uv already bootstrapped;
- uv, from a lock: the same with the lock given (every other host, a repair).

Also the one-time bootstrap of uv itself (venv, pip, the uv wheel), and the host probe's damage
check (``state_probe._marker``: stat every file of the manifest) on the stand-in release on the
host and, on the controller, on a big venv: 4 hard-linked copies of this checkout's ``.venv``
(~20,000 files besides bytecode caches, the order of a vLLM release with torch). Prints medians
and ratios.
"""

from __future__ import annotations

import argparse
import base64
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from harness.ssh import root_ssh
from kimi_deploy.host.command import hostside_command
from kimi_deploy.hostside import state_probe, venv_install
from localcluster.pypi_mirror import DEMO_RECIPE
from localcluster.state import Settings

ROOT = Path(__file__).resolve().parent.parent


REQUIREMENTS = ["vllm==0.34.0", "fastsafetensors==0.5.0"]
SCRATCH = "/var/tmp/kimi-venv-bench"  # noqa: S108 - on the test host, made and removed here
# Time one call of the probe's damage check on the host: state_probe.py's source, then the release.
_TIME_MARKER = (
    "import base64,sys,time;g={'__name__':'bench'};exec(base64.b64decode(sys.argv[1]),g);"
    "t=time.perf_counter();n=20;[g['_marker'](sys.argv[2]) for _ in range(n)];"
    "print((time.perf_counter()-t)/n)"
)


class Host:
    def __init__(self, state: dict[str, Any]) -> None:
        first = state["hosts"][0]
        self.name = first["name"]
        self.ssh = root_ssh(state, first["address"])

    def run(self, command: str) -> tuple[float, str]:
        """Seconds ``command`` took on the host (SSH included), and its stdout."""
        started = time.perf_counter()
        done = subprocess.run([*self.ssh, command], capture_output=True, text=True, check=False, timeout=600)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"{self.name}: {command[:80]}... failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return seconds, done.stdout


def _pip(index_url: str, path: str) -> str:
    host = shlex.quote(urlparse(index_url).hostname or "")
    pip = f"{path}/bin/pip install --no-cache-dir --disable-pip-version-check --no-input -q"
    return (
        f"rm -rf {path} && python3 -m venv {path} && {pip} --index-url {shlex.quote(index_url)} "
        f"--trusted-host {host} {' '.join(REQUIREMENTS)}"
    )


def _uv(index_url: str, path: str, uv: dict[str, str], lock: str | None) -> str:
    request = {
        "path": path,
        "requirements": REQUIREMENTS,
        "index_url": index_url,
        "marker": {"package": "vllm"},
        "uv": uv,
        "lock": {"text": lock} if lock else None,
    }
    return hostside_command("python3", "venv_install.py", request)


def _big_venv(copies: int) -> tuple[Path, int]:
    """Hard-linked copies of this checkout's .venv under one folder, with a manifest and marker."""
    root = Path(tempfile.mkdtemp(prefix="kimi-big-venv-", dir="/var/tmp"))
    for i in range(copies):
        subprocess.run(["cp", "-al", str(ROOT / ".venv"), str(root / f"copy{i}")], check=True)
    files = venv_install._manifest(str(root))
    (root / venv_install.MANIFEST).write_text(json.dumps({"files": files}), encoding="utf-8")
    (root / venv_install.MARKER).write_text(json.dumps({"manifest": venv_install.MANIFEST}), encoding="utf-8")
    return root, len(files)


def _marker_seconds(path: Path, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        marker = state_probe._marker(str(path))
        assert marker is not None
        assert marker["damaged"] is None
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    settings = Settings.from_env()
    state = json.loads((settings.state_dir / "state.json").read_text(encoding="utf-8"))
    index_url = state["services"]["index"]["url"]
    host = Host(state)
    from kimi_deploy.recipe_file import load_recipe  # noqa: PLC0415 - only the pin is needed

    version = load_recipe(DEMO_RECIPE).tools.uv
    uv = {"version": version, "dir": f"{SCRATCH}/uv-{version}"}
    path = f"{SCRATCH}/vllm-0.34.0+fastsafetensors-0.5.0"
    host.run(f"rm -rf {SCRATCH}")
    try:
        bootstrap = host.run(_uv(index_url, path, uv, None))[0]
        lock = host.run(f"cat {path}/{venv_install.LOCK}")[1]
        pip_s, resolve_s, locked_s = [], [], []
        for _ in range(args.runs):
            pip_s.append(host.run(_pip(index_url, path))[0])
            resolve_s.append(host.run(f"rm -rf {path} && " + _uv(index_url, path, uv, None))[0])
            locked_s.append(host.run(f"rm -rf {path} && " + _uv(index_url, path, uv, lock))[0])
        files = len(json.loads(host.run(f"cat {path}/{venv_install.MANIFEST}")[1])["files"])
        code = base64.b64encode((ROOT / "kimi_deploy/hostside/state_probe.py").read_bytes()).decode()
        probe_small = float(host.run(f"python3 -c {shlex.quote(_TIME_MARKER)} {code} {path}")[1])
    finally:
        host.run(f"rm -rf {SCRATCH}")
    big, big_files = _big_venv(4)
    try:
        probe_big = _marker_seconds(big)
    finally:
        shutil.rmtree(big)
    pip_m, resolve_m, locked_m = (statistics.median(s) for s in (pip_s, resolve_s, locked_s))
    print(f"stand-in vLLM release ({', '.join(REQUIREMENTS)}) on {host.name}, median of {args.runs}, SSH included:")
    print(f"  pip (venv + pip install):        {pip_m:6.2f} s")
    print(f"  uv, resolving the lock:          {resolve_m:6.2f} s   pip/uv {pip_m / resolve_m:4.1f}x")
    print(f"  uv, from a given lock:           {locked_m:6.2f} s   pip/uv {pip_m / locked_m:4.1f}x")
    print(f"  uv bootstrap + first install:    {bootstrap:6.2f} s   (once per host and uv version)")
    print("probe damage check (stat every file of the manifest), warm cache:")
    print(f"  stand-in release on the host:    {probe_small * 1e3:6.2f} ms ({files} files)")
    print(f"  big venv on the controller:      {probe_big * 1e3:6.2f} ms ({big_files} files)")


if __name__ == "__main__":
    main()
