"""A fleet of N hosts of one's own: recipes/demo-gpu.yaml grown to N hosts, converged, re-run,
and read back through the Hub's own counters and every instance's endpoint.

The recipe keeps the demo's two topologies: vLLM, one instance per host, on all hosts but the
last few, and SGLang, one instance across the last ``sglang_hosts(n)`` hosts (2 up to 8 hosts,
4 beyond), with its communication check. The hosts have no GPUs: the engines are the cluster's
stand-ins, as in the end-to-end tests.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.demo_recipes import demo_gpu_data
from harness.own_cluster import OwnCluster, Run, hub_json

FLEET = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-fleet", "KIMI_CLUSTER_SUBNET": "10.213.20.0/24"})


def sglang_hosts(n: int) -> int:
    """How many of ``n`` hosts the one SGLang instance spans."""
    return 2 if n <= 8 else 4


def recipe(cluster: OwnCluster, folder: Path, n: int) -> Path:
    """The demo recipe on ``n`` hosts, written to ``folder``."""
    data = demo_gpu_data(cluster.dir / "api-key")
    spread = sglang_hosts(n)
    vllm, sglang = data["topologies"]["demo-vllm"], data["topologies"]["demo-sglang"]
    vllm["pools"]["serve"].update(hosts=n - spread, instances=n - spread)
    sglang["pools"]["serve"].update(hosts=spread, parallel={"tp": 8 * spread, "ep": 8})
    path = folder / f"fleet-{n}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def inventory(cluster: OwnCluster, folder: Path, n: int) -> Path:
    """The inventory of the fleet's ``n`` hosts with its recipe."""
    spread = sglang_hosts(n)
    groups = f"demo_vllm = _hosts[:{n - spread}]\ndemo_sglang = _hosts[{n - spread}:]\n"
    return cluster.inventory(folder / f"fleet-{n}.py", recipe(cluster, folder, n), groups)


def hub(cluster: OwnCluster, path: str, method: str = "GET") -> dict[str, Any]:
    """The cluster's Hub answer to ``path`` (``/_stats``, ``/_stats/reset``)."""
    return hub_json(cluster.state(), path, method)


def bodies_served(cluster: OwnCluster) -> dict[str, int]:
    """How many bodies the Hub started sending, per file, since its counters were last reset."""
    return {path: n for path, n in hub(cluster, "/_stats")["downloads"].items() if n}


@dataclass(frozen=True)
class Endpoint:
    host: str
    url: str


def endpoints(cluster: OwnCluster, n: int) -> list[Endpoint]:
    """Every instance's API: each vLLM host's, and the SGLang instance's on its leader (the
    first of its hosts), at the ports the planner gives the demo's topologies."""
    hosts = cluster.state()["hosts"]
    spread = sglang_hosts(n)
    found = [Endpoint(h["name"], f"http://{h['address']}:8000") for h in hosts[: n - spread]]
    leader = hosts[n - spread]
    return [*found, Endpoint(leader["name"], f"http://{leader['address']}:30000")]


def answers(cluster: OwnCluster, endpoint: Endpoint) -> bool:
    """Whether ``endpoint`` answers the recipe's smoke prompt with the word it expects."""
    key = (cluster.dir / "api-key").read_text(encoding="utf-8").strip()
    smoke = demo_gpu_data(cluster.dir / "api-key")["smoke"]
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": smoke["prompt"]}]}
    request = urllib.request.Request(  # noqa: S310 - an http:// endpoint of the cluster
        f"{endpoint.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            answer = json.loads(response.read())
    except (OSError, ValueError):
        return False
    return smoke["expect"] in str(answer.get("choices", [{}])[0].get("message", {}).get("content", ""))


def fleet_arguments(description: str) -> argparse.Namespace:
    """The command line the fleet benchmarks share: host counts, runs per figure, keep the fleet up."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hosts", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the last fleet up")
    return parser.parse_args()


def for_each_size(args: argparse.Namespace, measure: Callable[[int, Path], str], fresh: bool = False) -> None:
    """``measure(n, folder)`` for each of ``args.hosts``, in a folder of its own, printing the line
    it returns; the fleet goes down at the end unless ``args.keep`` (``fresh``: before each too)."""
    try:
        for n in args.hosts:
            if fresh:
                FLEET.cli("down")
            with tempfile.TemporaryDirectory(prefix="kimi-fleet-") as tmp:
                print(measure(n, Path(tmp)), flush=True)
    finally:
        if not args.keep:
            FLEET.cli("down")


def failed(which: str, log: str) -> str:
    """One line naming the failed run and where its whole log is kept, then the log's end."""
    with tempfile.NamedTemporaryFile("w", prefix=f"kimi-fleet-{which}-", suffix=".log", delete=False) as f:
        f.write(log)
    return f"the {which} run failed (its log: {f.name}):\n{log[-3000:]}"


def timed(cluster: OwnCluster, inventory_file: Path, *args: str, deploy: str = "deploys/kimi.py") -> tuple[Run, float]:
    """A pyinfra run on the fleet and its wall time in seconds."""
    started = time.perf_counter()
    run = cluster.pyinfra(inventory_file, *args, deploy=deploy)
    return run, time.perf_counter() - started
