"""Fault drills under a client load through the gateway: time to detect, to recover, failed requests.

    python bench/drills.py [--concurrency 4] [--drills engine-killed,engine-garbage,...]

A cluster of its own (``/var/lib/kimi-cluster-drills``, 10.213.21.0/24): two B300 hosts, each
serving one instance of the stand-in vLLM, behind the real vllm-router 0.1.17 and the gateway
(Debian's nginx) on a third host; the router's hosted fallback is an OpenAI-shaped API on this
machine (``harness/hosted_api.py``, answering "READY (hosted)"). Converged with a quick watchdog
ladder (a round a second, a check failing after 2 s, 2 failed checks restart, 1 restart then
drain). For each drill, ``--concurrency`` clients send chat completions through the gateway in a
loop while ``deploys/drill.py`` injects the fault:

- ``engine-killed`` (kimi-h1): SIGKILL to the engine; systemd starts it again;
- ``engine-garbage`` (kimi-h2): the engine answers garbage with 200 (the cluster's knob);
- ``accelerator-lost`` (kimi-h1): a GPU falls off the bus (the cluster's knob);
- ``both-stopped`` (both): both engines stopped; the gateway's hosted fallback answers;
- ``shard-corrupted`` (kimi-h2): a shard's bytes flipped, size and mtime kept; the scrub starts;
- ``link-cut`` (kimi-h1): its link to the router's host cut (a blackhole route), healed after the
  watch;
- ``host-down`` (kimi-h1): the host loses its link and powers off (the cluster's knob); booted
  again by ``kimi-deploy cluster up`` after the watch;
- ``hub-down-sync`` (both): a converge to the model's revision B (five of its 103 files new, the
  rest copied from revision A on the hosts), the Hub sending at 5 kB/s; 2 s after it began to send
  the new shards, it goes down (503 on everything, the shards on their way cut short). Detect: the
  converge failing (its one line per host printed); recover: the converge run again once the Hub is
  back, done and serving revision B. Printed beside: the Hub's bytes over the new files' bytes
  (1.00: each new byte sent once, nothing sent before the fault sent again), and the clients'
  answers meanwhile (the release serving before goes on serving).

Figures, from the watchdog's own record on the drilled host (its state file: when a unit left
``serving``, its actions) and the clients' answers, all on this machine's clock:

- detect: injection to the watchdog's first sign (a unit leaving ``serving``, or an action);
- recover: injection to the service whole again: the drilled instance serving again (killed,
  corrupted), drained with every request answered by the other (garbage, accelerator), or the
  first hosted answer (both stopped);
- failed: requests answered with no 200 (by error); wrong: 200s whose content was not READY
  (the garbage served before the watchdog drained it); hosted: answered by the fallback;
- up: whether every second of the drill had at least one good answer.

A cut link and a host down leave no watchdog to tell (the host's own checks pass, or it is off):
those two are measured as the clients see them, over a watch of ``FIXED_WATCH_S``: detect is the
end of the first answer that failed or was slow (more than five times the median before the
drill, and over a second), recover the end of the last one, when the router had routed around the
fault (none when it had not, 10 s before the watch ended).

Between drills, ``clear`` and a converge put the cluster back, and the drill after waits until
the router sends to both engines again (printed: the router takes a stopped engine back only
after its own health checks and circuit breaker allow, up to minutes). At the end, the watchdog's own
cost on each engine host: CPU seconds per round and resident memory, from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.demo_recipes import demo_gpu_data
from harness.hosted_api import HostedApi
from harness.own_cluster import OwnCluster, Run, hub_json
from harness.ssh import root_ssh
from localcluster.hub import write_faults

ROOT = Path(__file__).resolve().parent.parent


CLUSTER = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-drills", "KIMI_CLUSTER_SUBNET": "10.213.21.0/24"})
ENGINES = ("kimi-h1", "kimi-h2")
ROUTER = "kimi-h3"
PROMPT = "Reply with exactly the word READY and nothing else."
HOSTED = "READY (hosted)"
LADDER = {
    "interval_s": 1,
    "timeout_s": 2,
    "canary_interval_s": 1,
    "canary_timeout_s": 5,
    "restart_after": 2,
    "restarts": 1,
    "grace_s": 30,
}
# a converge drill, not deploys/drill.py's
HUB_DOWN = "hub-down-sync"
MODEL = "moonshotai/Kimi-K3.1-Pro-Tiny"
REVISION_A = "23eb01d77aab1f1b9ff6dda80033b783970fe79c"  # the recipe's, serving when the drill starts
REVISION_B = "1088b4b0a968514a4de7da23014f7058bbfbd30c"
# slow enough that the Hub is still sending revision B's new shards when it goes down
SLOW_BYTES_PER_S = 5_000
# drill -> the hosts it is injected on
DRILLS = {
    "engine-killed": ("kimi-h1",),
    "engine-garbage": ("kimi-h2",),
    "accelerator-lost": ("kimi-h1",),
    "both-stopped": ENGINES,
    "shard-corrupted": ("kimi-h2",),
    "link-cut": ("kimi-h1",),
    "host-down": ("kimi-h1",),
    HUB_DOWN: ENGINES,
}
# the drills no watchdog tells, watched as the clients see them for this long
CLIENT_SEEN = ("link-cut", "host-down")
FIXED_WATCH_S = 60
# deploys/drill.py's data for a drill beyond its name
DATA = {"link-cut": ("--data", f"kimi_drill_peer={ROUTER}", "--data", "kimi_drill_for_s=600")}
HARDWARE = "b300x8,b300x8,none"
# the drill deploys/drill.py injects for each of these
INJECT = {"both-stopped": "engine-stopped"}
# the longest a drill is watched
WATCH_S = 120


def _recipe(folder: Path, hosted: HostedApi, revision: str | None = None) -> Path:
    key = CLUSTER.dir / "api-key"
    hosted_key = folder / "hosted-key"
    hosted_key.write_text(hosted.key + "\n", encoding="utf-8")
    data = demo_gpu_data(key)
    vllm = data["topologies"]["demo-vllm"]
    vllm["group"] = "drill_routed"
    vllm["pools"]["serve"]["group"] = "drill_vllm"
    vllm["router"] = {
        "group": "drill_router",
        "package": "vllm-router",
        "policy": "round_robin",
        "fallback": {"url": hosted.loopback_url, "api_key": {"file": str(hosted_key)}, "model": "kimi-hosted"},
    }
    data["routers"] = {"vllm-router": {"version": "0.1.17"}}
    data["topologies"] = {"demo-vllm": vllm}
    data["watchdog"] = LADDER
    if revision is not None:
        data["model"]["revision"] = revision
    path = folder / ("recipe.yaml" if revision is None else f"recipe-{revision[:8]}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _inventory(folder: Path, recipe: Path) -> Path:
    groups = "drill_vllm = _hosts[:2]\ndrill_router = _hosts[2:3]\ndrill_routed = _hosts[:3]"
    return CLUSTER.inventory(folder / "inventory.py", recipe, groups)


def _ssh(st: dict[str, Any], host: str, command: str) -> str:
    address = next(h["address"] for h in st["hosts"] if h["name"] == host)
    out = subprocess.run(
        [*root_ssh(st, address), command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return out.stdout.strip()


def _limit(hosts: tuple[str, ...]) -> list[str]:
    return [arg for h in hosts for arg in ("--limit", h)]


def _must(run: Run, what: str) -> Run:
    if run.code != 0:
        # the lines that name a host's failure (pyinfra goes on with the other hosts), then the end
        said = [line for line in run.log.splitlines() if "kimi-deploy:" in line or "Error" in line]
        sys.exit(f"{what} failed:\n" + "\n".join(said[-20:]) + f"\n...\n{run.log[-2000:]}")
    return run


@dataclass
class Load:
    """Clients sending chat completions through the gateway in a loop; every answer recorded."""

    url: str
    key: str
    concurrency: int
    answers: list[tuple[float, float, str, str]] = field(default_factory=list)  # start, end, kind, detail
    stop: threading.Event = field(default_factory=threading.Event)

    def _one(self) -> tuple[str, str]:
        body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
        request = urllib.request.Request(  # noqa: S310 - the cluster's gateway
            f"{self.url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - the cluster's gateway
                content = json.loads(answer.read())["choices"][0]["message"]["content"] or ""
        except urllib.error.HTTPError as exc:
            return "failed", f"HTTP {exc.code}"
        except (OSError, ValueError, KeyError, IndexError) as exc:
            return "failed", type(exc).__name__
        if content == "READY":
            return "local", ""
        if content == HOSTED:
            return "hosted", ""
        return "wrong", content[:40]

    def _client(self) -> None:
        while not self.stop.is_set():
            start = time.time()
            kind, detail = self._one()
            self.answers.append((start, time.time(), kind, detail))

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.concurrency)]
        for t in threads:
            t.start()
        return threads


def _watchdog(st: dict[str, Any], host: str) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(_ssh(st, host, "cat /var/lib/kimi/watchdog.json") or "{}")
    except ValueError:
        return {}
    return found


def _detected(state: dict[str, Any], since: float) -> float | None:
    """The watchdog's first sign after ``since``: a unit out of serving, or an action."""
    unit = state.get("units", {}).get("kimi-vllm", {})
    signs = [a["at"] for a in state.get("actions", []) if a.get("at", 0) >= since]
    if unit.get("state") not in (None, "serving") and unit.get("since", 0) >= since:
        signs.append(unit["since"])
    return min(signs) if signs else None


def _seen_by_clients(
    answers: list[tuple[float, float, str, str]], before: list[float], injected: float, watched: float
) -> tuple[float | None, float | None]:
    """Detect and recover as the clients saw the drill (see the module's doc)."""
    usual = sorted(before)[len(before) // 2] if before else 0.0
    bad = [a for a in answers if a[2] in ("failed", "wrong") or a[1] - a[0] > max(1.0, 5 * usual)]
    if not bad:
        return None, None
    last = max(a[1] for a in bad)
    return min(a[1] for a in bad), (last if last < watched - 10 else None)


def _lock(revision: str) -> dict[str, Any]:
    files: dict[str, Any] = json.loads(
        (ROOT / "recipes/locks" / f"{MODEL.replace('/', '--')}@{revision}.json").read_text(encoding="utf-8")
    )["files"]
    return files


def _new_bytes() -> int:
    """The bytes of revision B's files that revision A, on the hosts, lacks: all a sync must fetch."""
    a, b = _lock(REVISION_A), _lock(REVISION_B)
    return sum(int(f["size"]) for path, f in b.items() if a.get(path, {}).get("digest") != f["digest"])


def _shards_started(st: dict[str, Any]) -> int:
    """The weight files whose bodies the Hub has begun to send since its counters were reset."""
    started: dict[str, int] = hub_json(st, "/_stats")["downloads"]
    return sum(n for path, n in started.items() if path.endswith(".safetensors"))


def _answers_since(load: Load, first: int, injected: float) -> tuple[list[Any], dict[str, Any]]:
    """The clients' answers sent since the fault, and what they saw: requests, each kind of answer,
    the errors, and whether some answer came in every second ("up")."""
    recent = [a for a in load.answers[first:] if a[0] >= injected]
    kinds = {k: sum(1 for a in recent if a[2] == k) for k in ("local", "hosted", "wrong", "failed")}
    errors: dict[str, int] = {}
    for a in recent:
        if a[2] in ("failed", "wrong"):
            errors[f"{a[2]}: {a[3]}"] = errors.get(f"{a[2]}: {a[3]}", 0) + 1
    good = sorted(a[1] for a in recent if a[2] in ("local", "hosted"))
    seconds = range(int(injected), int(recent[-1][1]) if recent else 0)
    up = all(any(s <= t < s + 1 for t in good) for s in seconds)
    return recent, {"requests": len(recent), **kinds, "errors": errors, "up": up}


def _hub_down_sync(st: dict[str, Any], inventory: Path, recipe_b: Path, load: Load) -> dict[str, Any]:
    """The Hub down in the middle of a converge's sync (see the module's doc)."""
    hub = CLUSTER.dir / "hub"
    for h in ENGINES:  # revision B has to come from the Hub
        _ssh(st, h, f"rm -rf /srv/models/{MODEL.replace('/', '--')}/{REVISION_B}")
    hub_json(st, "/_stats/reset", "POST")
    write_faults(hub, {"slow_bytes_per_s": SLOW_BYTES_PER_S})
    first = len(load.answers)
    runs: list[Run] = []
    converge = threading.Thread(
        target=lambda: runs.append(CLUSTER.pyinfra(inventory, "--data", f"kimi_recipe={recipe_b}"))
    )
    converge.start()
    deadline = time.time() + 300
    while time.time() < deadline and converge.is_alive() and not _shards_started(st):
        time.sleep(0.3)
    time.sleep(2)  # a part of each new shard on its way
    injected = time.time()
    write_faults(hub, {"down": True, "retry_after": 1})
    try:
        converge.join()
    finally:
        write_faults(hub, None)
    detect = time.time()
    failed = [line.strip() for line in runs[0].log.splitlines() if "kimi-deploy: weights" in line]
    if runs[0].code == 0 or not failed:
        sys.exit(f"{HUB_DOWN}: the converge did not fail on the Hub going down:\n{runs[0].log[-3000:]}")
    _must(CLUSTER.pyinfra(inventory, "--data", f"kimi_recipe={recipe_b}"), f"{HUB_DOWN}: the converge after")
    recover = time.time()
    time.sleep(3)
    sent = sum(hub_json(st, "/_stats")["bytes"].values())
    recent, seen = _answers_since(load, first, injected)
    # when the hosted API answered, from the fault: within the failed converge (before detect_s) or
    # the one after it, which restarts the engines on revision B
    times = [a[1] - injected for a in recent if a[2] == "hosted"]
    hosted = [round(min(times), 1), round(max(times), 1)] if times else None
    return {
        "drill": HUB_DOWN,
        "hosts": list(ENGINES),
        "detect_s": round(detect - injected, 2),
        "recover_s": round(recover - injected, 2),
        **seen,
        "converge_said": failed[0][:200],
        "hosted_s": hosted,
        "hub_bytes": sent,
        "new_bytes": _new_bytes(),
        "hub_bytes_over_new": round(sent / _new_bytes(), 3),
    }


def _drill(name: str, st: dict[str, Any], inventory: Path, load: Load) -> dict[str, Any]:
    hosts = DRILLS[name]
    first = len(load.answers)
    injected = time.time()
    drill = INJECT.get(name, name)
    _must(
        CLUSTER.pyinfra(
            inventory, "--data", f"kimi_drill={drill}", *DATA.get(name, ()), *_limit(hosts), deploy="deploys/drill.py"
        ),
        f"drill {name}",
    )
    detect = recover = None
    deadline = injected + WATCH_S
    if name in CLIENT_SEEN:
        time.sleep(max(0.0, injected + FIXED_WATCH_S - time.time()))
        before = [a[1] - a[0] for a in load.answers[:first] if a[2] == "local"]
        detect, recover = _seen_by_clients(
            [a for a in load.answers[first:] if a[0] >= injected], before, injected, time.time()
        )
        deadline = 0.0
    while time.time() < deadline and recover is None:
        time.sleep(0.5)
        states = {h: _watchdog(st, h) for h in hosts}
        signs = [d for h in hosts if (d := _detected(states[h], injected)) is not None]
        detect = min(signs) if signs else detect
        state = states[hosts[0]].get("units", {}).get("kimi-vllm", {})
        recent = load.answers[first:]
        if name == "both-stopped":
            # the gateway's detection: the first answer from the hosted API
            hosted = [a[1] for a in recent if a[2] == "hosted"]
            detect = recover = min(hosted) if hosted else None
        elif name in ("engine-garbage", "accelerator-lost"):
            if state.get("state") == "drained":
                recover = state["since"]
        elif name == "shard-corrupted":
            restarts = [
                a["at"]
                for a in states[hosts[0]].get("actions", [])
                if a.get("at", 0) >= injected and a.get("action") == "restart"
            ]
            if restarts and state.get("state") == "serving" and state.get("since", 0) > min(restarts):
                recover = state["since"]
        elif detect is not None and state.get("state") == "serving" and state.get("since", 0) > injected:
            recover = state["since"]
    time.sleep(3)  # the answers after recovery
    _, seen = _answers_since(load, first, injected)
    return {
        "drill": name,
        "hosts": list(hosts),
        "detect_s": round(detect - injected, 2) if detect else None,
        "recover_s": round(recover - injected, 2) if recover else None,
        **seen,
    }


def _routed(st: dict[str, Any]) -> dict[str, float]:
    """The router's count of requests it sent to each engine (its Prometheus exporter, loopback
    on the router host: ``vllm_router_processed_requests_total{worker=...}``)."""
    text = _ssh(st, ROUTER, "curl -s http://127.0.0.1:29000/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm_router_processed_requests_total{"):
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            out[worker] = out.get(worker, 0) + float(line.rsplit(" ", 1)[1])
    return out


def _in_rotation(st: dict[str, Any], gateway: str, key: str) -> float:
    """Seconds until the router sends requests to both engines again: it takes an engine back
    after its own health checks and circuit breaker let it (the recipe's ``router.health``: checks
    every 5 s, a circuit open 10 s; vllm-router 0.1.17's own defaults are 60 s each)."""
    started = time.time()
    load = Load(gateway, key, 1)
    workers = [f"http://{h['address']}:8000" for h in st["hosts"] if h["name"] in ENGINES]
    while time.time() - started < 300:
        before = _routed(st)
        for _ in range(6):
            load._one()
        after = _routed(st)
        if all(after.get(w, 0) > before.get(w, 0) for w in workers):
            return time.time() - started
        time.sleep(2)
    sys.exit("the router did not send to both engines again within 300 s")


def _restore(st: dict[str, Any], inventory: Path, gateway: str, key: str, boot: bool) -> float:
    """Boot a host the drill powered off (``boot``), clear the drills, converge, and wait for both
    engines serving and in the router's rotation: the seconds the router took to take them back."""
    if boot:
        CLUSTER.cli("up", "--hardware", HARDWARE)
    _must(
        CLUSTER.pyinfra(inventory, "--data", "kimi_drill=clear", *_limit(ENGINES), deploy="deploys/drill.py"), "clear"
    )
    _must(CLUSTER.pyinfra(inventory), "converge after the drill")
    deadline = time.time() + 120
    while time.time() < deadline:
        states = [_watchdog(st, h).get("units", {}).get("kimi-vllm", {}).get("state") for h in ENGINES]
        if states == ["serving", "serving"]:
            return _in_rotation(st, gateway, key)
        time.sleep(0.5)
    sys.exit("the engines did not serve again after a drill")


def _cost(st: dict[str, Any], host: str) -> tuple[float, int, str, float]:
    """The watchdog's CPU seconds (user + system, its process tree), resident KiB, pid and age in
    seconds: one SSH round-trip reads its clock ticks, the host's uptime, /proc stat and status."""
    out = _ssh(
        st,
        host,
        "p=$(systemctl show -p MainPID --value kimi-watchdog); getconf CLK_TCK; "
        "cut -d' ' -f1 /proc/uptime; cat /proc/$p/stat; "
        "awk '/^VmRSS/ {print $2}' /proc/$p/status",
    ).splitlines()
    ticks, uptime, rss = int(out[0]), float(out[1]), int(out[3])
    pid, stat = out[2].split(" ", 1)[0], out[2].rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12]) + int(stat[13]) + int(stat[14])) / ticks
    return cpu, rss, pid, uptime - int(stat[19]) / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--drills", default=",".join(DRILLS))
    args = parser.parse_args()
    names = [d for d in args.drills.split(",") if d]
    for name in names:
        if name not in DRILLS:
            sys.exit(f"--drills: no drill {name!r} (known: {', '.join(DRILLS)})")
    os.environ.setdefault("KIMI_API_KEY", "sk-drills-0123456789abcdef")
    with tempfile.TemporaryDirectory() as tmp, CLUSTER.fresh(HARDWARE, Path(tmp)) as st:
        folder = Path(tmp)
        # on the router host's own loopback: a recipe sends a hosted key in the clear nowhere else
        router = next(h["address"] for h in st["hosts"] if h["name"] == ROUTER)
        hosted = HostedApi(st["gateway"], "hosted-secret-0123456789", answers={PROMPT: HOSTED}, loopback_of=router)
        try:
            inventory = _inventory(folder, _recipe(folder, hosted))
            started = time.time()
            _must(CLUSTER.pyinfra(inventory), "the first converge")
            print(f"converged in {time.time() - started:.0f} s")
            rounds_start = {h: (time.time(), _cost(st, h)) for h in ENGINES}
            gateway = f"http://{next(h['address'] for h in st['hosts'] if h['name'] == ROUTER)}:8000"
            key = (CLUSTER.dir / "api-key").read_text(encoding="utf-8").strip()
            results = []
            print(f"both engines in the router's rotation after {_in_rotation(st, gateway, key):.1f} s")
            recipe_b = _recipe(folder, hosted, REVISION_B)
            for name in names:
                load = Load(gateway, key, args.concurrency)
                threads = load.run()
                time.sleep(3)
                try:
                    if name == HUB_DOWN:
                        results.append(_hub_down_sync(st, inventory, recipe_b, load))
                    else:
                        results.append(_drill(name, st, inventory, load))
                finally:
                    load.stop.set()
                    for t in threads:
                        t.join(timeout=40)
                results[-1]["back_in_rotation_s"] = round(_restore(st, inventory, gateway, key, name == "host-down"), 1)
                print(json.dumps(results[-1]))
            print()
            print(
                f"{'drill':<18}{'detect s':>9}{'recover s':>10}{'requests':>9}{'failed':>7}{'wrong':>6}"
                f"{'hosted':>7}  up   errors"
            )
            for r in results:
                detect, recover = (r[k] if r[k] is not None else "-" for k in ("detect_s", "recover_s"))
                print(
                    f"{r['drill']:<18}{detect:>9}{recover:>10}{r['requests']:>9}{r['failed']:>7}{r['wrong']:>6}"
                    f"{r['hosted']:>7}  {'yes' if r['up'] else 'NO ':<4} {r['errors'] or ''}"
                )
            print()
            for h in ENGINES:
                t0, (cpu0, _, pid0, _) = rounds_start[h]
                cpu1, rss, pid1, age = _cost(st, h)
                # a converge that changed its configuration (hub-down-sync) restarted it: then the
                # process running now, over its own life
                same = pid1 == pid0
                used, seconds = (cpu1 - cpu0, time.time() - t0) if same else (cpu1, age)
                hours, rounds = seconds / 3600, seconds / LADDER["interval_s"]
                since = "" if same else f" (restarted by a converge: since its start, pid {pid1})"
                print(
                    f"{h} watchdog{since}: {used:.2f} CPU s over {hours * 60:.1f} min ({rounds:.0f} rounds at "
                    f"{LADDER['interval_s']} s: {1000 * used / max(rounds, 1):.1f} ms a round, "
                    f"{used / max(hours, 1e-9) / 36:.2f}% of a core), {rss / 1024:.1f} MiB resident"
                )
        finally:
            hosted.close()


if __name__ == "__main__":
    main()
