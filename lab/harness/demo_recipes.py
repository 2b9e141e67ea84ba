"""The demo recipes as the end-to-end tests and the benchmarks converge them: recipes/demo-gpu.yaml
with the API key of a cluster of one's own, and demo-ar (SGLang over two hosts, torch pinned in
its release, the all-reduce check with gloo)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.own_cluster import ROOT, OwnCluster

# The API key file recipes/demo-gpu.yaml names: the demo cluster's
DEMO_KEY = "/var/lib/kimi-cluster/api-key"


def demo_gpu_data(key_file: Path) -> dict[str, Any]:
    """recipes/demo-gpu.yaml, with ``key_file`` as its API key."""
    text = (ROOT / "recipes/demo-gpu.yaml").read_text(encoding="utf-8")
    data: dict[str, Any] = yaml.safe_load(text.replace(DEMO_KEY, str(key_file)))
    return data


def recipe_for(cluster: OwnCluster, folder: Path, min_busbw_gbs: float, generation: str = "1") -> Path:
    """The demo recipe with one topology, demo-ar: SGLang over both hosts, torch pinned in its
    release, the all-reduce check with gloo at ``min_busbw_gbs``; a new ``generation`` restarts it."""
    data = demo_gpu_data(cluster.dir / "api-key")
    sglang = data["topologies"]["demo-sglang"]
    data["engines"]["sglang"]["packages"] = {"torch": "2.13.0"}
    data["topologies"] = {
        "demo-ar": {
            **sglang,
            "group": "demo_ar",
            "expose": {"bind": "address", "api_key": {"file": str(cluster.dir / "api-key")}},
            "comm_check": {
                "min_mbit_s": 100,
                "deadline_s": 15,
                "all_reduce": {
                    "backend": "gloo",
                    "min_busbw_gbs": min_busbw_gbs,
                    "min_bytes": 2**20,
                    "max_bytes": 8 * 2**20,
                    "iters": 10,
                    "deadline_s": 60,
                },
            },
            # a new value restarts both engines
            "env": {"KIMI_DEMO_GENERATION": generation},
            "pools": {"serve": {"group": "demo_ar", "role": "serve", "hosts": 2, "parallel": {"tp": 16, "ep": 8}}},
        }
    }
    path = folder / f"recipe-{generation}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path
