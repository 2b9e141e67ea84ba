"""The serving benchmark against the release it replaced: what the release record keeps of a run
(``figures``) and the difference printed when the release serving changed (an upgrade by pin, a
rollback).

The earlier figures come back from a host (its release history), outside the recipe: each is
taken only when it has the expected type, anything else counting as missing.
"""

from __future__ import annotations

from kimi_deploy.benchmark.report import number
from kimi_deploy.benchmark.types import Figures, KeptLevel, LevelReport, Report
from kimi_deploy.hostside.boundary_text import shown


def _kept(lv: LevelReport) -> KeptLevel:
    """What a run keeps of level ``lv``."""
    cost = lv["cost"]
    return {
        "concurrency": lv["concurrency"],
        "requests": lv["requests"],
        "succeeded": lv["succeeded"],
        "success_rate": lv["success_rate"],
        "ttft_p50_s": lv["ttft_p50_s"],
        "ttft_p95_s": lv["ttft_p95_s"],
        "itl_p50_ms": lv["itl_p50_ms"],
        "output_tok_s": lv["output_tok_s"],
        "cost_per_success": None if cost is None else cost["per_success"],
    }


def figures(rep: Report) -> Figures:
    """The figures of report ``rep`` (``kimi_deploy.benchmark.report.report``) a release record keeps."""
    targets = {name: [_kept(lv) for lv in levels] for name, levels in rep["targets"].items()}
    return {"run": rep["run"], "at": rep["at"], "tasks": rep["tasks"], "targets": targets}


def _change(now: float | None, then: float | None, unit: str, digits: int) -> str:
    if now is None:
        return "-"
    text = f"{now:.{digits}f}{unit}"
    if then is None:
        return text
    if then == 0:
        return f"{text} (was {then:.{digits}f})"
    return f"{text} ({(now - then) / then:+.0%} vs {then:.{digits}f})"


def format_delta(now: Figures, before: object, release: object) -> list[str]:
    """One line per target and concurrency found in both runs (``now`` and ``before["figures"]``,
    as ``figures`` makes them): TTFT p50, output tokens/s, success rate and cost per success, each
    against the earlier release's; nothing when there is none. ``before`` and ``release`` are the
    host's answer, whatever it holds."""
    if not isinstance(before, dict) or not isinstance(before.get("figures"), dict):
        return []
    then_targets = before["figures"].get("targets")
    if not isinstance(then_targets, dict):
        return []
    head = (
        f"Against release {shown(str(before.get('release')), 80)} (benchmarked {shown(str(before.get('at')), 40)}), "
        f"now {shown(str(release), 80)}:"
    )
    lines = []
    for name, levels in now["targets"].items():
        earlier = then_targets.get(name)
        earlier = earlier if isinstance(earlier, list) else []
        by_level = {lv.get("concurrency"): lv for lv in earlier if isinstance(lv, dict)}
        for lv in levels:
            was = by_level.get(lv["concurrency"])
            if was is None:
                continue
            rate, then_rate = lv["success_rate"], number(was.get("success_rate"))
            points = (
                "-"
                if rate is None
                else f"{rate:.0%}" + ("" if then_rate is None else f" ({100 * (rate - then_rate):+.0f} pt)")
            )
            lines.append(
                f"  {name} at {lv['concurrency']}: TTFT p50 "
                f"{_change(lv['ttft_p50_s'], number(was.get('ttft_p50_s')), ' s', 3)}, output "
                f"{_change(lv['output_tok_s'], number(was.get('output_tok_s')), ' tok/s', 1)}, "
                f"success {points}, cost/success "
                f"{_change(lv['cost_per_success'], number(was.get('cost_per_success')), '', 6)}"
            )
    return [head, *lines] if lines else []
