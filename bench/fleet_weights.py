"""Weights on N hosts through links all shaped to one rate: the time to put W on every host vs W / rate.

    python bench/fleet_weights.py [--hosts 16] [--mbit 20] [--keep]

Root only. The fleet of ``harness.fleet`` (N hosts, the demo recipe grown to them), converged;
then the revision is deleted on every host, every link is shaped to ``--mbit`` with tc tbf (htb for the Hub's) (each
host's veth at both ends: what it receives and what it sends; and the Hub's answers where they
leave this machine for the bridge: the controller's own SSH there is not a link of the fleet), and
the converge that puts it back is timed. A no-op converge measured in the same
run is the floor subtracted from it. W is the revision's size; W / rate is the least time any
distribution can take (every byte crosses one host's link at least once); a host fetching from
one source that serves all the others (a star) needs about (N - 1) x W / rate. Prints the time,
its ratio to W / rate, the weights' own steps (their step lines' times) and their ratio, and the
bytes the Hub sent (W: each file once).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from harness.fleet import FLEET, failed, hub, inventory, timed
from harness.own_cluster import host_ssh
from harness.shaping import shaped_from_ports, tbf, tbf_argv
from localcluster.hub import CDN_PORT_OFFSET
from localcluster.state import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--mbit", type=float, default=1.0, help="the rate of every link")
    parser.add_argument("--keep", action="store_true", help="leave the fleet up")
    args = parser.parse_args()
    n = args.hosts
    FLEET.cli("up", "--hosts", str(n))
    settings = Settings.from_env(FLEET.env)
    st = FLEET.state()
    links = [settings.veth(h["address"]) for h in st["hosts"]]
    hub_port = int(st["services"]["hub"]["url"].rsplit(":", 1)[1])
    try:
        with tempfile.TemporaryDirectory(prefix="kimi-fleet-") as tmp:
            inv = inventory(FLEET, Path(tmp), n)
            recipe = yaml.safe_load(inv.with_name(f"fleet-{n}.yaml").read_text(encoding="utf-8"))
            model = recipe["model"]
            size = int(model["size_bytes"])
            folder = f"/srv/models/{model['repo'].replace('/', '--')}/{model['revision']}"
            first, _ = timed(FLEET, inv)
            if first.code != 0:
                sys.exit(failed("first", first.log))
            floor = statistics.median(timed(FLEET, inv)[1] for _ in range(3))

            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda h: host_ssh(st, h, f"rm -rf {folder}"), st["hosts"]))
            hub(FLEET, "/_stats/reset", "POST")
            shaped_from_ports(settings.bridge, (hub_port, hub_port + CDN_PORT_OFFSET), args.mbit)
            for link in links:
                tbf(link, args.mbit)
            uplinks(st, args.mbit)
            try:
                run, seconds = timed(FLEET, inv)
            finally:
                for link in [settings.bridge, *links]:
                    tbf(link, None)
                uplinks(st, None)
            if run.code != 0:
                sys.exit(failed("shaped", run.log))
            sent = sum(hub(FLEET, "/_stats")["bytes"].values())
    finally:
        for link in [settings.bridge, *links]:
            tbf(link, None)
        if not args.keep:
            FLEET.cli("down")
    least = size / (args.mbit * 1_000_000 / 8)
    net = seconds - floor
    print(
        f"N={n}: W = {size} bytes, every link {args.mbit} Mbit/s: W / rate = {least:.2f} s, "
        f"a star about {(n - 1) * least:.1f} s"
    )
    print(
        f"converge {seconds:.2f} s, minus the no-op floor {floor:.2f} s: {net:.2f} s = {net / least:.2f} x W / rate "
        "(with the engines' restarts on the new files and their smoke tests); "
        f"the Hub sent {sent} bytes ({sent / size:.2f} W)"
    )
    # The weights' own steps, as the converge's step lines time them ("--> <step>: ... in <s> s").
    steps = re.findall(r"--> kimi \| (Weights[^:]*):.* in ([0-9.]+) s", run.log)
    for name, took in steps:
        print(f"  {name}: {took} s")
    spent = sum(float(took) for _, took in steps)
    print(f"the weights' steps: {spent:.2f} s = {spent / least:.2f} x W / rate")


def uplinks(st: dict[str, Any], mbit: float | None) -> None:
    """Every host's own end of its link (what it sends), shaped from inside the host."""
    command = " ".join(tbf_argv("eth0", mbit)) + (" 2>/dev/null || true" if mbit is None else "")
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda h: host_ssh(st, h, command), st["hosts"]))


if __name__ == "__main__":
    main()
