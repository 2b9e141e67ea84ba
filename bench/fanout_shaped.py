"""Download once, fan out: time to put a revision on 4 hosts through a slow link to the Hub.

    python bench/fanout_shaped.py [--uplink-mbit 8] [--lan-mbit 200]

Needs a converged demo cluster (scripts/demo), and root: it shapes the cluster's links with tc tbf
for the time of the run. The Hub (on the bridge's gateway address) reaches the hosts through the
bridge device, so a tbf on the bridge shapes exactly the hosts' way to the Hub, the "uplink"; a
tbf on each host's veth shapes its own LAN link (traffic between hosts never crosses the bridge
device). W is the revision's size in bytes. For each mode the revision is deleted on the 4 hosts,
then ``deploys/kimi.py`` converges them, timed; a no-op converge measured in the same run is the
floor to subtract. Modes:

- ``hub``: the recipe without ``weights.fan_out``, every host pulls W from the Hub;
- ``fan-out``: the demo recipe, one host pulls W from the Hub, the others from it.

The limits are W / uplink (once through the uplink) and 4 W / uplink (four times).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from harness.own_cluster import host_ssh as ssh
from harness.own_cluster import hub_json as hub
from harness.shaping import tbf
from localcluster.state import Settings

ROOT = Path(__file__).resolve().parent.parent


PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
HOSTS = 4
GPU_RECIPE = "recipes/demo-gpu.yaml"


def converge(*extra: str) -> float:
    # The stand-in engines' recipe unless told another: this bench measures the weights' paths.
    recipe = [] if any(e.startswith("kimi_recipe=") for e in extra) else ["--data", f"kimi_recipe={GPU_RECIPE}"]
    started = time.perf_counter()
    run = subprocess.run(
        [PYINFRA, "inventories/demo.py", "deploys/kimi.py", "-y", *recipe, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if run.returncode != 0:
        sys.exit(f"converge failed:\n{run.stdout[-3000:]}{run.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uplink-mbit", type=int, default=8, help="rate of the hosts' link to the Hub")
    parser.add_argument("--lan-mbit", type=int, default=200, help="rate of each host's own link")
    args = parser.parse_args()
    settings = Settings.from_env()
    state = json.loads((settings.state_dir / "state.json").read_text(encoding="utf-8"))
    hosts = state["hosts"][:HOSTS]
    recipe = yaml.safe_load((ROOT / GPU_RECIPE).read_text(encoding="utf-8"))
    revision_dir = f"/srv/models/{recipe['model']['repo'].replace('/', '--')}/{recipe['model']['revision']}"
    size = recipe["model"]["size_bytes"]
    without = dict(recipe)
    without["weights"] = {k: v for k, v in recipe["weights"].items() if k != "fan_out"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=ROOT / "recipes", delete=False) as f:
        yaml.safe_dump(without, f, sort_keys=False)
        hub_only = Path(f.name)
    links = [settings.bridge] + [settings.veth(h["address"]) for h in hosts]
    try:
        converge()
        floor = statistics.median(converge() for _ in range(3))
        results: dict[str, tuple[float, int]] = {}
        for mode, extra in (("hub", ["--data", f"kimi_recipe={hub_only.relative_to(ROOT)}"]), ("fan-out", [])):
            for h in hosts:
                ssh(state, h, f"rm -rf {revision_dir}")
            hub(state, "/_stats/reset", "POST")
            tbf(settings.bridge, args.uplink_mbit)
            for link in links[1:]:
                tbf(link, args.lan_mbit)
            try:
                seconds = converge(*extra)
            finally:
                for link in links:
                    tbf(link, None)
            served = sum(hub(state, "/_stats")["bytes"].values())
            results[mode] = (seconds, served)
    finally:
        for link in links:
            tbf(link, None)
        hub_only.unlink()
        converge()
    rate = args.uplink_mbit * 1_000_000 / 8
    once, four = size / rate, HOSTS * size / rate
    print(
        f"W = {size} bytes on {HOSTS} hosts; uplink to the Hub {args.uplink_mbit} Mbit/s, "
        f"host links {args.lan_mbit} Mbit/s"
    )
    print(f"limits: W / uplink = {once:.2f} s, {HOSTS} W / uplink = {four:.2f} s; no-op converge (floor) {floor:.2f} s")
    print(f"{'mode':10} {'converge s':>11} {'minus floor':>12} {'Hub bytes':>11} {'x W/uplink':>11}")
    for mode, (seconds, served) in results.items():
        net = seconds - floor
        print(f"{mode:10} {seconds:11.2f} {net:12.2f} {served:11d} {net / once:11.2f}")
    hub_s, fan_s = (results[m][0] - floor for m in ("hub", "fan-out"))
    print(
        f"fan-out is {hub_s / fan_s:.2f}x faster than every host from the Hub, and the Hub sent "
        f"{results['hub'][1] / max(results['fan-out'][1], 1):.2f}x fewer bytes"
    )


if __name__ == "__main__":
    main()
