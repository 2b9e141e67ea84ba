"""The serving benchmark as a picture: latency, throughput and success against concurrency.

Four panels side by side, one line per target (the deployment, and the hosted API where it was
compared): time to first token (p50 solid, p95 dashed), output tokens per second, and the share
of tasks that passed their acceptance rule, and, where the recipe prices serving, the cost per
successful task. Drawn with matplotlib's Agg backend (no display), as a PNG; matplotlib is the
extra ``kimi-deploy[plot]``: importing this module without it raises ``MissingExtra``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from kimi_deploy.benchmark.types import LevelReport, Report
from kimi_deploy.extras import need

need("matplotlib").use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

COLORS = {"local": "#1f77b4", "hosted": "#d62728"}


def _series(
    levels: list[LevelReport], field: Literal["ttft_p50_s", "ttft_p95_s", "output_tok_s", "success_rate"]
) -> tuple[list[int], list[float]]:
    points = [(c, v) for lv in levels if (v := lv[field]) is not None and (c := lv["concurrency"])]
    return [c for c, _ in points], [v for _, v in points]


def draw(rep: Report, path: Path) -> None:
    """Write the report ``rep`` (``kimi_deploy.benchmark.report.report``) as a PNG at ``path``."""
    fig, (lat, tput, ok, cost) = plt.subplots(1, 4, figsize=(18, 4.6), dpi=100)
    levels_seen: set[int] = set()
    currency = None
    for name, levels in rep["targets"].items():
        color = COLORS.get(name, "#555555")
        label = "this deployment" if name == "local" else "hosted API"
        levels_seen |= {c for lv in levels if (c := lv["concurrency"])}
        x, p50 = _series(levels, "ttft_p50_s")
        lat.plot(x, p50, "o-", color=color, label=f"{label} p50")
        x, p95 = _series(levels, "ttft_p95_s")
        lat.plot(x, p95, "s--", color=color, label=f"{label} p95")
        x, tok = _series(levels, "output_tok_s")
        tput.plot(x, tok, "o-", color=color, label=label)
        x, rate = _series(levels, "success_rate")
        ok.plot(x, [100 * r for r in rate], "o-", color=color, label=label)
        priced = [
            (lv["concurrency"], lv["cost"]["per_success"])
            for lv in levels
            if lv["cost"] and lv["cost"]["per_success"] is not None
        ]
        if priced:
            first = levels[0]["cost"]
            assert first is not None  # the recipe prices every level or none
            currency = first["currency"]
            cost.plot([c for c, _ in priced], [v for _, v in priced], "o-", color=color, label=label)
    panels = [
        (lat, "Time to first token", "seconds"),
        (tput, "Output throughput", "tokens/s"),
        (ok, "Tasks passing their acceptance rule", "% of requests"),
        (cost, "Cost per successful task", currency or "not priced"),
    ]
    ticks = sorted(levels_seen)
    for ax, title, unit in panels:
        ax.set_title(title)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(unit)
        ax.set_xscale("log", base=2)
        if ticks:
            ax.set_xticks(ticks, [str(t) for t in ticks])
        top = ax.get_ylim()[1]
        ax.set_ylim(0, top * 1.1 if top > 0 else 1)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    ok.set_ylim(0, 105)
    fig.suptitle(f"Serving benchmark: {rep['topology']} via {rep['endpoint']} ({rep['at']})")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
