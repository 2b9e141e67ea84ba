"""The serving benchmark's report: every answer judged, the figures per target and concurrency,
and the cost per successful task (``deploys/bench.py`` prints it, writes it as JSON and draws it).

What the generator host recorded is outside the recipe: it was loaded through
``hostside.boundary_json``'s bounds, and here each field is taken only when it has the expected
type (a number, a string, a task's index), anything else counting as missing.

Cost per successful task is the deployment guides' formula, (compute or API fees + storage and
network + operations + human correction) / successful tasks, over the time a level ran: the
accelerator-hours of the topology's engine hosts at the recipe's price, the monthly storage,
network and operations figures for that share of a month (730 hours), and the correction minutes
of every failed attempt, each counted once. On the hosted side the fees are its token prices for
the tokens the level sent and received, plus the same correction cost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_deploy.accelerators import accelerator
from kimi_deploy.benchmark.judge import judge
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.recipe import Benchmark, Cost
from kimi_deploy.servespec import HostPlan

HOURS_PER_MONTH = 730.0


def number(value: Any) -> float | None:
    """``value`` when a host's record holds a number there (not a flag), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ms_to_s(value: Any) -> float | None:
    ms = number(value)
    return None if ms is None else round(ms / 1000, 4)


def accelerators(topology: Sequence[HostPlan]) -> tuple[str, float]:
    """The priced kind of the topology's engine hosts and how many of it they hold (hosts, for a
    kind priced by the host: CPUs)."""
    engines = [p for p in topology if any(u.kind == "engine" for u in p.units)]
    if not engines:
        return "-", 0.0
    kind = accelerator(engines[0].accelerator_vendor)
    name = kind.price_name(engines[0].accelerator_model)
    if kind.priced_by_host:
        return name, float(len(engines))
    return name, float(sum(p.accelerators for p in engines))


def _cost(
    cost: Cost | None,
    target: str,
    *,
    kind: str,
    count: float,
    wall_s: float,
    failures: int,
    tokens_in: float,
    tokens_out: float,
    succeeded: int,
) -> dict[str, Any] | None:
    if cost is None:
        return None
    hours = wall_s / 3600
    share = hours / HOURS_PER_MONTH
    parts: dict[str, float] = {}
    if target == "local":
        parts["compute"] = cost.accelerator_hour.get(kind, 0.0) * count * hours
        parts["storage_network"] = cost.storage_network_month * share
        parts["operations"] = cost.operations_hours_month * cost.operations_rate_hour * share
    else:
        parts["api_fees"] = (tokens_in * cost.hosted_input_per_mtok + tokens_out * cost.hosted_output_per_mtok) / 1e6
    parts["correction"] = failures * cost.correction_minutes_per_failure / 60 * cost.correction_rate_hour
    total = sum(parts.values())
    return {
        "currency": cost.currency,
        **{k: round(v, 8) for k, v in parts.items()},
        "total": round(total, 8),
        "per_success": round(total / succeeded, 8) if succeeded else None,
    }


def level_report(bench: Benchmark, target: str, level: Mapping[str, Any], kind: str, count: float) -> dict[str, Any]:
    """One level of one target: the answers judged and the figures."""
    tasks = bench.tasks
    requests = [r for r in level.get("requests") or [] if isinstance(r, dict)]
    judged: list[tuple[int, str | None]] = []
    errors: Counter[str] = Counter()
    tokens_in = tokens_out = 0.0
    for r in requests:
        row = r.get("row")
        if not isinstance(row, int) or isinstance(row, bool) or not 0 <= row < len(tasks):
            continue
        error = _text(r.get("error"))
        text = _text(r.get("text"))
        calls = r.get("tool_calls") if isinstance(r.get("tool_calls"), list) else None
        if error:
            errors[shown(error.strip().splitlines()[-1] if error.strip() else error, 120)] += 1
            judged.append((row, f"request failed: {shown(error, 120)}"))
        else:
            judged.append((row, judge(tasks[row], text, calls)))
        tokens_in += number(r.get("input_tokens")) or 0
        tokens_out += number(r.get("output_tokens")) or 0
    succeeded = sum(1 for _, why in judged if why is None)
    failed_tasks: dict[str, dict[str, Any]] = {}
    for row, why in judged:
        if why is not None:
            entry = failed_tasks.setdefault(tasks[row].id, {"failed": 0, "first_reason": why})
            entry["failed"] += 1
    summary = _dict(level.get("summary"))
    wall = number(level.get("wall_s")) or 0.0
    gen, eng = number(level.get("generator_cpu_s")), number(level.get("engine_cpu_s"))
    return {
        "concurrency": level.get("concurrency") if isinstance(level.get("concurrency"), int) else None,
        "requests": len(judged),
        "succeeded": succeeded,
        "success_rate": round(succeeded / len(judged), 4) if judged else None,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "failed_tasks": failed_tasks,
        "ttft_p50_s": _ms_to_s(summary.get("p50_ttft_ms")),
        "ttft_p95_s": _ms_to_s(summary.get("p95_ttft_ms")),
        "itl_p50_ms": number(summary.get("p50_itl_ms")),
        "itl_p95_ms": number(summary.get("p95_itl_ms")),
        "output_tok_s": number(summary.get("output_throughput")),
        "wall_s": wall,
        "generator_cpu_s": gen,
        "engine_cpu_s": eng,
        "kv_cache_usage": number(level.get("kv_cache_usage")),
        "accelerator_memory_mib": number(level.get("accelerator_memory_mib")),
        "unit_memory_mib": number(level.get("unit_memory_mib")),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "generator_error": shown(level["error"], 300) if isinstance(level.get("error"), str) else None,
        "cost": _cost(
            bench.cost,
            target,
            kind=kind,
            count=count,
            wall_s=wall,
            failures=len(judged) - succeeded,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            succeeded=succeeded,
        ),
    }


def report(
    bench: Benchmark, found: Mapping[str, Any], topology: Sequence[HostPlan], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """The whole report from the generator host's record ``found`` (``hostside/bench_load.py``)."""
    kind, count = accelerators(topology)
    targets = _dict(found.get("targets"))
    out: dict[str, list[dict[str, Any]]] = {}
    for name in ("local", "hosted"):
        levels = targets.get(name)
        if isinstance(levels, list):
            out[name] = [level_report(bench, name, lv, kind, count) for lv in levels if isinstance(lv, dict)]
    return {
        **meta,
        "run": found.get("run") if isinstance(found.get("run"), str) else None,
        "at": found.get("at") if isinstance(found.get("at"), str) else None,
        "accelerators": {"kind": kind, "count": count},
        # the CPU seconds the generator took to start (vLLM imported), once for the whole run
        "generator_load_cpu_s": number(found.get("generator_load_cpu_s")),
        "tasks": [t.id for t in bench.tasks],
        "targets": out,
    }


COLUMNS = (
    "target",
    "conc",
    "requests",
    "success",
    "TTFT p50/p95 s",
    "ITL p50/p95 ms",
    "out tok/s",
    "errors",
    "KV peak",
    "accel MiB",
    "engine MiB",
    "CPU gen/engine s",
    "cost/success",
)


def _f(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(name: str, lv: Mapping[str, Any]) -> list[str]:
    cost = lv.get("cost") or {}
    per = cost.get("per_success")
    kv = lv.get("kv_cache_usage")
    return [
        name,
        str(lv.get("concurrency")),
        str(lv.get("requests")),
        "-" if lv.get("success_rate") is None else f"{lv['succeeded']}/{lv['requests']} ({lv['success_rate']:.0%})",
        f"{_f(lv.get('ttft_p50_s'), 3)}/{_f(lv.get('ttft_p95_s'), 3)}",
        f"{_f(lv.get('itl_p50_ms'), 1)}/{_f(lv.get('itl_p95_ms'), 1)}",
        _f(lv.get("output_tok_s"), 1),
        str(lv.get("errors")),
        "-" if kv is None else f"{kv:.1%}",
        _f(lv.get("accelerator_memory_mib"), 0),
        _f(lv.get("unit_memory_mib"), 0),
        f"{_f(lv.get('generator_cpu_s'), 1)}/{_f(lv.get('engine_cpu_s'), 1)}",
        "-" if not cost else ("no success" if per is None else f"{per:.6f} {cost.get('currency')}"),
    ]


def format_report(rep: Mapping[str, Any]) -> str:
    """The report as a table: one line per target and concurrency, then why tasks failed."""
    rows = [list(COLUMNS)]
    notes: list[str] = []
    for name, levels in rep.get("targets", {}).items():
        for lv in levels:
            rows.append(_row(name, lv))
            if lv.get("generator_error"):
                at = f"{name} at concurrency {lv.get('concurrency')}"
                notes.append(f"{at}: the generator failed: {lv['generator_error']}")
            for task, entry in lv.get("failed_tasks", {}).items():
                notes.append(
                    f"{name} at concurrency {lv.get('concurrency')}: task {task} failed "
                    f"{entry['failed']}x: {entry['first_reason']}"
                )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    head = (
        f"Serving benchmark of {rep.get('topology')} through {rep.get('endpoint')} "
        f"(generator on {rep.get('generator')}, its start {_f(rep.get('generator_load_cpu_s'), 1)} s of CPU)"
    )
    return "\n".join([head, *lines, *notes])
