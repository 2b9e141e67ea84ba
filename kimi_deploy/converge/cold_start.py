"""A cold start broken down: how long each phase of a host's converge took, and the table a
converge ends with.

The controller times each operation on each host, from the operation's start to that host's
success or error (``kimi_pyinfra.cold_start``), and sums the times by phase: the phase of an
operation follows from its name (``phase_of``). A host's time to serving is the sum of its
phases: the time its own steps took, not the time it waited at a step's barrier for slower hosts.

``cold_start_lines`` is the report: one headline naming the slowest host and its slowest phase,
``--> Cold start: kimi-h2 slowest, 74 s to serving (release install 41 s)``, then one row per
host that took a step, slowest first (at more than ``FOLD_AT`` hosts: the ``FOLDED`` slowest and
one row of each phase's median and max). A host that failed shows the phase it failed in instead
of a time to serving; when the run stopped before its last step, no host got to serving.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kimi_deploy.engines import ENGINES
from kimi_deploy.hostside.requests import EngineStartAsked
from kimi_deploy.plan.servespec import HostPlan

Phase = Literal[
    "drivers", "release install", "weights", "compile cache", "communication check", "units and start", "smoke", "other"
]
PHASES: tuple[Phase, ...] = (
    "drivers",
    "release install",
    "weights",
    "compile cache",
    "communication check",
    "units and start",
    "smoke",
    "other",
)
# serving: every step of the run ended and none failed on it; failed: a step failed there;
# stopped: the run ended before its last step (a signal, or every other host failed)
Outcome = Literal["serving", "failed", "stopped"]

# The deploy's step names (kimi_pyinfra/deploys/kimi.py, start_order.py, operations/commcheck.py),
# by the start of the name after its deploy's prefix (``kimi | ``), suffixes such as
# `` (first batch)`` included. The drivers' steps are the ``drivers`` deploy's, whatever their names.
_BY_NAME: tuple[tuple[str, Phase], ...] = (
    ("Releases (engine, host tools)", "release install"),
    ("Weights at the pinned revision", "weights"),
    ("Weights transfer key", "weights"),
    ("Weights served to peers", "weights"),
    ("Weights no longer served to peers", "weights"),
    ("Compile cache placed", "compile cache"),
    ("Compile cache served to peers", "compile cache"),
    ("Compile cache no longer served", "compile cache"),
    ("Compile cache packed", "compile cache"),
    ("Communication check", "communication check"),
    ("All-reduce check", "communication check"),
    ("Rendered units and configs", "units and start"),
    ("Current release", "units and start"),
    ("Timers", "units and start"),
    ("Services:", "units and start"),
    ("Smoke test", "smoke"),
)
DRIVERS_DEPLOY = "drivers"
# More hosts than this: the slowest FOLDED and a row of medians and maxima instead of every host.
FOLD_AT = 16
FOLDED = 5
# Failed hosts a headline names before "and N more".
NAMED = 8


def phase_of(step: str) -> Phase:
    """The phase of the step pyinfra names ``step`` (``kimi | drivers | NVIDIA driver pin``,
    ``kimi | Smoke test (first batch)``); ``other`` for a step of no phase (preflight, packages)."""
    parts = step.split(" | ")
    if DRIVERS_DEPLOY in parts[:-1]:
        return "drivers"
    name = parts[-1]
    return next((phase for prefix, phase in _BY_NAME if name.startswith(prefix)), "other")


@dataclass(frozen=True)
class HostColdStart:
    """One host's converge: seconds by phase (a phase it took no step in is absent)."""

    host: str
    seconds: Mapping[Phase, float] = field(default_factory=dict)
    outcome: Outcome = "serving"
    # the phase of the step that failed (outcome "failed" only)
    failed_in: Phase | None = None

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def slowest_phase(self) -> tuple[Phase, float]:
        """The phase it spent longest in (the first in ``PHASES`` order of equal ones)."""
        return max(((p, self.seconds.get(p, 0.0)) for p in PHASES), key=lambda ps: ps[1])


def seconds(value: float) -> str:
    """``0.4``, ``9.5``, ``41``: tenths below ten seconds, whole seconds from there."""
    return f"{value:.1f}" if round(value, 1) < 10 else f"{value:.0f}"


def _ranked(hosts: Sequence[HostColdStart]) -> list[HostColdStart]:
    """Serving (or stopped) hosts slowest first, then the failed ones, slowest first."""
    return sorted(hosts, key=lambda h: (h.outcome == "failed", -h.total, h.host))


def _failed_named(failed: Sequence[HostColdStart]) -> str:
    named = [f"{h.host} (in {h.failed_in or 'other'})" for h in failed[:NAMED]]
    more = f" and {len(failed) - NAMED} more" if len(failed) > NAMED else ""
    return f"{len(failed)} failed: {', '.join(named)}{more}"


def headline(hosts: Sequence[HostColdStart]) -> str:
    """``--> Cold start: kimi-h2 slowest, 74 s to serving (release install 41 s)``, then the
    failed hosts, if any, with the phase each failed in."""
    ranked = _ranked(hosts)
    failed = [h for h in ranked if h.outcome == "failed"]
    others = [h for h in ranked if h.outcome != "failed"]
    if others:
        slowest = others[0]
        phase, took = slowest.slowest_phase()
        if slowest.outcome == "serving":
            said = f"{slowest.host} slowest, {seconds(slowest.total)} s to serving ({phase} {seconds(took)} s)"
        else:
            said = (
                f"the run stopped before serving; {slowest.host} slowest so far, "
                f"{seconds(slowest.total)} s ({phase} {seconds(took)} s)"
            )
    else:
        said = "no host got to serving"
    if failed:
        said += f"; {_failed_named(failed)}"
    return f"--> Cold start: {said}"


def _row(h: HostColdStart) -> list[str]:
    cells = [seconds(h.seconds[p]) if p in h.seconds else "-" for p in PHASES]
    if h.outcome == "serving":
        end = seconds(h.total)
    elif h.outcome == "failed":
        end = f"failed in {h.failed_in or 'other'}"
    else:
        end = f"stopped ({seconds(h.total)})"
    return [h.host, *cells, end]


def _summary(hosts: Sequence[HostColdStart]) -> list[str]:
    """Each phase's median/max over ``hosts`` (a phase a host took no step in counts as 0 s)."""

    def both(values: list[float]) -> str:
        return f"{seconds(statistics.median(values))}/{seconds(max(values))}"

    cells = [both([h.seconds.get(p, 0.0) for h in hosts]) for p in PHASES]
    return [f"median/max of {len(hosts)}", *cells, both([h.total for h in hosts])]


def cold_start_lines(hosts: Sequence[HostColdStart]) -> list[str]:
    """The headline and the table, seconds per phase, one row per host of ``hosts`` (those that
    took a step), slowest first; nothing for no host. At more than ``FOLD_AT`` hosts: the
    ``FOLDED`` slowest that did not fail, and one row of every such host's median/max."""
    if not hosts:
        return []
    ranked = _ranked(hosts)
    rows = [["host", *PHASES, "to serving"]]
    if len(ranked) > FOLD_AT:
        going = [h for h in ranked if h.outcome != "failed"]
        rows += [_row(h) for h in going[:FOLDED]]
        if going:
            rows.append(_summary(going))
    else:
        rows += [_row(h) for h in ranked]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return [headline(hosts), *table]


def engine_start_lines(engines: Mapping[str, Mapping[str, Mapping[str, float]]]) -> list[str]:
    """What the engines said of their last start, host by host (``hostside.start_phases``): one
    line each, ``  kimi-h1 kimi-vllm: ready 62 s (engine load 0.0 s, compile 31 s)``; nothing
    when none said anything."""
    lines = []
    for host in sorted(engines):
        for unit, figures in sorted(engines[host].items()):
            parts = [f"{name} {seconds(value)} s" for name, value in figures.items() if name != "ready"]
            ready = figures.get("ready")
            head = f"ready {seconds(ready)} s" if ready is not None else "not ready in its log"
            lines.append(f"  {host} {unit}: {head}" + (f" ({', '.join(parts)})" if parts else ""))
    return ["Engine starts, in their own log lines:", *lines] if lines else []


def engine_starts_asked(spec: HostPlan) -> list[EngineStartAsked]:
    """The engine units of ``spec`` whose start its engine's own lines time (``Engine.start_phases``)."""
    asked: list[EngineStartAsked] = []
    kind = ENGINES.get(spec.engine)  # type: ignore[call-overload]  # a router host names no engine
    for unit in spec.units:
        if unit.kind != "engine" or kind is None:
            continue
        if kind.ready_line and kind.start_phases:
            phases = {name: [dict(r) for r in readings] for name, readings in kind.start_phases.items()}
            asked.append({"unit": unit.name, "phases": phases, "ready": kind.ready_line})
    return asked
