"""The serving benchmark's report: every answer judged, the figures per target and concurrency,
and the cost per successful task (``deploys/bench.py`` prints it, writes it as JSON and draws it).

What the generator host recorded is outside the recipe: it was loaded through
``hostside.boundary_json``'s bounds, and here each field is taken only when it has the expected
type (a number, a string, a task's index), anything else counting as missing. The report made
of them is a ``types.Report``.

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
from kimi_deploy.benchmark.types import FailedTask, LevelCost, LevelReport, Report, ReportMeta
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Benchmark, Cost

HOURS_PER_MONTH = 730.0


def number(value: object) -> float | None:
    """``value`` when a host's record holds a number there (not a flag), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


# the host's JSON object as it came, before each field is checked where it is taken
def _dict(value: object) -> dict[str, Any]:
    # a JSON object of the host's record, its fields not yet checked: each is, as it is taken
    return value if isinstance(value, dict) else {}


def _ms_to_s(value: object) -> float | None:
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
) -> LevelCost | None:
    if cost is None:
        return None
    hours = wall_s / 3600
    share = hours / HOURS_PER_MONTH
    correction = failures * cost.correction_minutes_per_failure / 60 * cost.correction_rate_hour
    if target == "local":
        compute = cost.accelerator_hour.get(kind, 0.0) * count * hours
        storage_network = cost.storage_network_month * share
        operations = cost.operations_hours_month * cost.operations_rate_hour * share
        total = compute + storage_network + operations + correction
        return {
            "currency": cost.currency,
            "compute": round(compute, 8),
            "storage_network": round(storage_network, 8),
            "operations": round(operations, 8),
            "correction": round(correction, 8),
            "total": round(total, 8),
            "per_success": round(total / succeeded, 8) if succeeded else None,
        }
    api_fees = (tokens_in * cost.hosted_input_per_mtok + tokens_out * cost.hosted_output_per_mtok) / 1e6
    total = api_fees + correction
    return {
        "currency": cost.currency,
        "api_fees": round(api_fees, 8),
        "correction": round(correction, 8),
        "total": round(total, 8),
        "per_success": round(total / succeeded, 8) if succeeded else None,
    }


def level_report(bench: Benchmark, target: str, level: Mapping[str, Any], kind: str, count: float) -> LevelReport:
    """One level of one target from its part of the host's record ``level`` (its fields unchecked,
    hence ``Any``): the answers judged and the figures."""
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
    failed_tasks: dict[str, FailedTask] = {}
    for row, why in judged:
        if why is not None:
            entry = failed_tasks.setdefault(tasks[row].id, {"failed": 0, "first_reason": why})
            entry["failed"] += 1
    summary = _dict(level.get("summary"))
    wall = number(level.get("wall_s")) or 0.0
    gen, eng = number(level.get("generator_cpu_s")), number(level.get("engine_cpu_s"))
    concurrency = level.get("concurrency")
    return {
        "concurrency": concurrency if isinstance(concurrency, int) else None,
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


def report(bench: Benchmark, found: Mapping[str, Any], topology: Sequence[HostPlan], meta: ReportMeta) -> Report:
    """The whole report from the generator host's record ``found`` (``hostside/bench_load.py``: a
    host's JSON, its fields unchecked, hence ``Any``)."""
    kind, count = accelerators(topology)
    targets = _dict(found.get("targets"))
    out: dict[str, list[LevelReport]] = {}
    for name in ("local", "hosted"):
        levels = targets.get(name)
        if isinstance(levels, list):
            out[name] = [level_report(bench, name, lv, kind, count) for lv in levels if isinstance(lv, dict)]
    run, at = found.get("run"), found.get("at")
    return {
        # meta's keys named, not unpacked: a TypedDict may hold more keys than it names, and an
        # unpacked one could bring a key of the report's own (``release``, ``before``) unchecked
        "topology": meta["topology"],
        "endpoint": meta["endpoint"],
        "generator": meta["generator"],
        "recipe": meta["recipe"],
        "run": run if isinstance(run, str) else None,
        "at": at if isinstance(at, str) else None,
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


def _f(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _row(name: str, lv: LevelReport) -> list[str]:
    cost = lv["cost"]
    rate, kv = lv["success_rate"], lv["kv_cache_usage"]
    return [
        name,
        str(lv["concurrency"]),
        str(lv["requests"]),
        "-" if rate is None else f"{lv['succeeded']}/{lv['requests']} ({rate:.0%})",
        f"{_f(lv['ttft_p50_s'], 3)}/{_f(lv['ttft_p95_s'], 3)}",
        f"{_f(lv['itl_p50_ms'], 1)}/{_f(lv['itl_p95_ms'], 1)}",
        _f(lv["output_tok_s"], 1),
        str(lv["errors"]),
        "-" if kv is None else f"{kv:.1%}",
        _f(lv["accelerator_memory_mib"], 0),
        _f(lv["unit_memory_mib"], 0),
        f"{_f(lv['generator_cpu_s'], 1)}/{_f(lv['engine_cpu_s'], 1)}",
        "-" if cost is None else _per_success(cost),
    ]


def _per_success(cost: LevelCost) -> str:
    per = cost["per_success"]
    return "no success" if per is None else f"{per:.6f} {cost['currency']}"


def format_report(rep: Report) -> str:
    """The report as a table: one line per target and concurrency, then why tasks failed."""
    rows = [list(COLUMNS)]
    notes: list[str] = []
    for name, levels in rep["targets"].items():
        for lv in levels:
            rows.append(_row(name, lv))
            if lv["generator_error"]:
                at = f"{name} at concurrency {lv['concurrency']}"
                notes.append(f"{at}: the generator failed: {lv['generator_error']}")
            for task, entry in lv["failed_tasks"].items():
                notes.append(
                    f"{name} at concurrency {lv['concurrency']}: task {task} failed "
                    f"{entry['failed']}x: {entry['first_reason']}"
                )
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    head = (
        f"Serving benchmark of {rep['topology']} through {rep['endpoint']} "
        f"(generator on {rep['generator']}, its start {_f(rep['generator_load_cpu_s'], 1)} s of CPU)"
    )
    return "\n".join([head, *lines, *notes])
