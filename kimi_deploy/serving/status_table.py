"""What serves where: every host's units as the state a converge reads shows them, then where the
topologies' clients send requests and a curl that asks each one (``deploys/status.py``).

One row per host and unit of the plan: the host's place (topology, pool and instance, role), the
unit's systemd state and since when, the watchdog's state of it, whether a smoke test found it
serving since its last start, and the release serving on the host (its engine, its id, the
weights revision). Under the table, what needs an operator's eye (a host not probed, a release
other than the plan's, the watchdog's findings), the benchmark figures kept with each release
serving, and the endpoints with their curl.

Everything a host said (systemd's words, its release record, the watchdog's file, the benchmark's
figures) is checked for its type and shown through ``printable``, bounded, never as it came.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from kimi_deploy.benchmark.report import number
from kimi_deploy.converge.cold_start import PHASES, seconds
from kimi_deploy.converge.plan import Converge, UnitTarget
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.hostside.probe_types import UnitState
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.endpoints import curl, endpoints
from kimi_deploy.serving.watchdog_report import STALE_ROUNDS, STATES, release_time, watchdog_lines

HEADER = ("HOST", "TOPOLOGY", "ROLE", "UNIT", "STATE", "SINCE", "WATCHDOG", "SMOKE", "RELEASE", "REVISION")
# the most characters of one host's text a cell shows
_CELL = 40


@dataclass(frozen=True)
class HostStatus:
    """One host of the run: its part of the plan and its converge (None: its plan failed), what its
    probe found (None: not probed), and ``error``, why either is missing."""

    host: str
    deploy: DeployPlan | None
    todo: Converge | None
    found: HostState | None
    error: str | None = None


def host_text(value: object, limit: int = _CELL, *, cut: str = "...") -> str:
    """A host's text as a cell shows it: printable, at most ``limit`` characters (then ``cut``);
    "?" for what is not text."""
    if not isinstance(value, str):
        return "?"
    kept = value[:limit] + (cut if len(value) > limit else "")
    return printable(kept) or "-"


def ago(seconds: float) -> str:
    """How long ago, in the largest unit that fits: ``45 s ago``, ``12 min ago``, ``3 h ago``."""
    if seconds < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def _role(status: HostStatus) -> str:
    if status.deploy is None:
        return "-"
    spec = status.deploy.spec
    if spec.node_role == "router":
        return "router"
    return f"{spec.pool}#{spec.instance} {spec.node_role}"


# a host's JSON, whatever it holds: each value is checked where it is read
def _entry(found: HostState) -> dict[str, Any] | None:
    """What the probe read of the release ``current`` points to (``ReleaseEntry``), None without."""
    releases, current = found.get("releases"), found.get("current")
    if not isinstance(releases, dict) or not isinstance(current, str):
        return None
    records = releases.get("records")
    entry: object = records.get(current) if isinstance(records, dict) else None
    return cast(dict[str, Any], entry) if isinstance(entry, dict) else None  # checked where read


# the host's release.json, whatever it holds: each value is checked where it is read
def _record(found: HostState) -> dict[str, Any] | None:
    """The record of the release ``current`` points to, as the host keeps it; None without."""
    entry = _entry(found)
    record = entry.get("record") if entry is not None else None
    return record if isinstance(record, dict) else None


def _release(status: HostStatus) -> tuple[str, str]:
    """The release serving on the host and its weights revision, as cells."""
    found = status.found
    if found is None:
        return "-", "-"
    current = found.get("current")
    if not isinstance(current, str):
        return "none", "-"
    record = _record(found)
    release_id = host_text(os.path.basename(current.rstrip("/")), 12, cut="")
    mark = " *" if status.todo is not None and current != status.todo.release.dir else ""
    if record is None:
        return f"{release_id}{mark}", "?"
    engine = f"{host_text(record.get('engine'), 20)} {host_text(record.get('engine_version'), 20)}"
    revision = record.get("revision")
    return f"{engine} ({release_id}){mark}", host_text(revision, 12, cut="") if revision is not None else "-"


def _state(state: UnitState | None) -> str:
    if state is None:
        return "unknown"
    active, sub = host_text(state.get("active"), 20), host_text(state.get("sub"), 20)
    return active if sub in ("-", active) else f"{active} ({sub})"


def _since(state: UnitState | None, now: float) -> str:
    at = number(state.get("since")) if state is not None else None
    return "-" if at is None else ago(now - at)


def _watchdog(status: HostStatus, unit: str, now: float) -> str:
    """The watchdog's state of ``unit``: "-" where it watches none (no watchdog, a unit it does not
    watch), "not running" where its file is stale, else its state and since when."""
    if status.deploy is None or status.found is None or status.deploy.recipe.watchdog is None:
        return "-"
    found = status.found.get("watchdog")
    engine = any(u.name == unit and u.kind == "engine" for u in status.deploy.spec.units)
    if not isinstance(found, dict):
        return "no state yet" if engine else "-"
    records = found.get("units")
    record = records.get(unit) if isinstance(records, dict) else None
    if not isinstance(record, dict):
        return "-"
    updated = number(found.get("updated"))
    if updated is None or now - updated > STALE_ROUNDS * status.deploy.recipe.watchdog.interval_s + 60:
        return "not running"
    state = record.get("state")
    if state not in STATES:
        return "?"
    at = number(record.get("since"))
    return str(state) if at is None or state == "serving" else f"{state}, {ago(now - at)}"


def _smoke(target: UnitTarget, state: UnitState | None) -> str:
    """Whether a smoke test found ``target`` serving since it last (re)started: "passed", "not yet"
    (never since), "restarted since" (systemd restarted it after the last one passed); "-" for a
    unit without a smoke test."""
    if target.smoke is None:
        return "-"
    if state is None or not state.get("verified"):
        return "not yet"
    if state.get("restarts", 0) > state.get("restarts_verified", 0):
        return "restarted since"
    return "passed"


def _rows(status: HostStatus, now: float) -> list[tuple[str, ...]]:
    topology = status.deploy.spec.topology if status.deploy is not None else "-"
    release, revision = _release(status)
    head = (status.host, topology, _role(status))
    if status.todo is None or status.found is None:
        return [(*head, "-", "not probed", "-", "-", "-", release, revision)]
    rows: list[tuple[str, ...]] = []
    for i, target in enumerate(status.todo.units):
        state = status.found["units"].get(target.name)
        cells = (
            target.name,
            _state(state),
            _since(state, now),
            _watchdog(status, target.name, now),
            _smoke(target, state),
        )
        # the host's own cells on its first row alone
        mine, serving = (head, (release, revision)) if i == 0 else ((status.host, "", ""), ("", ""))
        rows.append((*mine, *cells, *serving))
    return rows


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _notes(status: HostStatus, now: float) -> list[str]:
    """What needs an operator's eye on the host, one line each."""
    if status.error is not None:
        return [f"{status.host}: not probed: {printable(status.error)}"]
    if status.deploy is None or status.todo is None or status.found is None:
        return []
    out = []
    current = status.found.get("current")
    if isinstance(current, str) and current != status.todo.release.dir:
        out.append(
            f"{status.host}: * serves {host_text(current, 120)}, not the plan's {status.todo.release.dir}: "
            "a converge puts the plan's in place"
        )
    watchdog = status.deploy.recipe.watchdog
    if watchdog is not None and isinstance(current, str):
        engines = [u.name for u in status.deploy.spec.units if u.kind == "engine"]
        since = release_time(status.found.get("last_release"))
        for line in watchdog_lines(
            status.found.get("watchdog"), engines, since=since, interval_s=watchdog.interval_s, now=now
        ):
            out.append(f"{status.host}: watchdog: {printable(line)}")
    return out


def _level(level: object) -> str | None:
    """One concurrency level of a kept run, in a few figures; None when it holds none."""
    if not isinstance(level, dict):
        return None
    concurrency = number(level.get("concurrency"))
    if concurrency is None:
        return None
    parts = []
    if (ttft := number(level.get("ttft_p50_s"))) is not None:
        parts.append(f"TTFT p50 {ttft:.3f} s")
    if (rate := number(level.get("output_tok_s"))) is not None:
        parts.append(f"{rate:.1f} tok/s")
    if (success := number(level.get("success_rate"))) is not None:
        parts.append(f"{success:.0%} ok")
    return f"at {int(concurrency)}: {', '.join(parts) or 'no figures'}"


def bench_lines(status: HostStatus) -> list[str]:
    """The serving benchmark's figures kept with the release serving on the host (the generator
    host of a run keeps them, ``bench.json``): one line per target, each concurrency level's TTFT
    p50, output tokens/s and success rate; nothing without."""
    entry = _entry(status.found) if status.found is not None else None
    bench = entry.get("bench") if entry is not None else None
    figures = bench.get("figures") if isinstance(bench, dict) else None
    targets = figures.get("targets") if isinstance(figures, dict) else None
    if not isinstance(bench, dict) or not isinstance(targets, dict):
        return []
    out = []
    for name, levels in targets.items():
        said = [line for level in (levels if isinstance(levels, list) else []) if (line := _level(level))]
        if said:
            at = host_text(bench.get("at"), 30)
            out.append(f"{status.host} ({at}), {host_text(name, 20)}: {'; '.join(said)}")
    return out


def cold_start_line(status: HostStatus) -> str | None:
    """How long the converge that left the serving release in place took on the host, by phase
    (``cold-start.json``, kept with the release: ``kimi_pyinfra.cold_start``); None without."""
    entry = _entry(status.found) if status.found is not None else None
    kept = entry.get("cold_start") if entry is not None else None
    if not isinstance(kept, dict) or not isinstance(kept.get("seconds"), dict):
        return None
    total = number(kept.get("to_serving"))
    by_phase = {p: v for p in PHASES if (v := number(kept["seconds"].get(p))) is not None and v > 0}
    if total is None or not by_phase:
        return None
    phases = ", ".join(f"{p} {seconds(v)} s" for p, v in by_phase.items())
    line = f"{status.host} ({host_text(kept.get('at'), 30)}): {seconds(total)} s to serving; {phases}"
    engines = kept.get("engine")
    for unit, figures in sorted(engines.items())[:8] if isinstance(engines, dict) else []:
        read = {k: number(v) for k, v in figures.items()} if isinstance(figures, dict) else {}
        said = [f"{host_text(k, 20)} {seconds(v)} s" for k, v in read.items() if v is not None][:6]
        if said:
            line += f"; {host_text(unit, 40)}: {', '.join(said)}"
    return line


def _endpoint_lines(hosts: Sequence[HostStatus]) -> list[str]:
    """Each topology of the run: its endpoints, and a curl that asks the first."""
    seen: set[tuple[str, str]] = set()
    out = []
    for status in hosts:
        deploy = status.deploy
        if deploy is None or (deploy.recipe_file, deploy.spec.topology) in seen:
            continue
        seen.add((deploy.recipe_file, deploy.spec.topology))
        name = deploy.spec.topology
        found = endpoints(deploy.topology)
        if not found:
            out.append(f"{name}: no endpoint: none of its units takes clients' requests")
            continue
        listed = ", ".join(f"{e.url} ({e.host}{', from that host alone' if e.loopback else ''})" for e in found)
        out.append(f"{name}: {listed}")
        expose = deploy.recipe.topologies[name].expose
        key = expose.api_key if expose is not None else None
        first = found[0]
        if first.loopback:
            out.append(f"  # on {first.host}: its API listens on loopback alone")
        asked = curl(first, deploy.recipe.model.served_name, deploy.recipe.smoke.prompt, key)
        out += [f"  {line}" for line in asked.splitlines()]
    return out


def format_status(hosts: Sequence[HostStatus], now: float | None = None) -> str:
    """The status of ``hosts`` (in inventory order): the table, the notes, the benchmark figures
    and the endpoints with their curl."""
    now = time.time() if now is None else now
    rows: list[tuple[str, ...]] = [HEADER]
    for status in hosts:
        rows += _rows(status, now)
    lines = _table(rows)
    notes = [line for status in hosts for line in _notes(status, now)]
    if notes:
        lines += ["", *notes]
    cold = [line for status in hosts if (line := cold_start_line(status))]
    if cold:
        lines += ["", "Cold start of the release serving:", *(f"  {line}" for line in cold)]
    bench = [line for status in hosts for line in bench_lines(status)]
    if bench:
        lines += ["", "Benchmark of the release serving:", *(f"  {line}" for line in bench)]
    served = _endpoint_lines(hosts)
    if served:
        lines += ["", "Endpoints:", *(f"  {line}" for line in served)]
    return "\n".join(lines) + "\n"
