"""The context ladder's proofs of every host as one table (``deploys/ladder.py`` prints it).

A rung climbed again under another key (an upgrade: another engine release, other hardware, the
topology changed) shows its time to first token against the last time the host passed that rung
under another key: how the release serving now compares with the one it replaced."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kimi_deploy.hostside.boundary_text import shown

COLUMNS = (
    "host",
    "unit",
    "rung",
    "result",
    "prompt",
    "TTFT s",
    "vs before",
    "decode tok/s",
    "KV peak",
    "accel MiB",
    "at",
)


def _cell(value: Any, digits: int | None = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits is not None:
        return f"{value:.{digits}f}"
    return str(value)


def _before(p: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> str:
    """``p``'s TTFT against the last passed proof of its unit and rung under another key."""
    was = [
        q
        for q in earlier
        if q.get("passed") is True
        and q.get("unit") == p.get("unit")
        and q.get("rung") == p.get("rung")
        and q.get("key") != p.get("key")
    ]
    now, then = p.get("ttft_s"), was[-1].get("ttft_s") if was else None
    if (
        p.get("passed") is not True
        or not isinstance(now, (int, float))
        or not isinstance(then, (int, float))
        or not then
    ):
        return "-"
    return f"{(now - then) / then:+.0%} ({then:.2f})"


def _row(host: str, p: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> list[str]:
    kv = p.get("kv_cache_usage")
    result = "passed" if p.get("passed") is True else f"failed: {shown(str(p.get('reason')), 120)}"
    return [
        host,
        str(p.get("unit")),
        str(p.get("rung")),
        result,
        _cell(p.get("prompt_tokens")),
        _cell(p.get("ttft_s"), 2),
        _before(p, earlier),
        _cell(p.get("decode_tok_s"), 1),
        f"{kv:.0%}" if isinstance(kv, (int, float)) else "-",
        _cell(p.get("accelerator_memory_mib")),
        str(p.get("at")),
    ]


def format_proofs(proofs: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Every host's rungs, in inventory order then as climbed; one line when none climbed."""
    rows = [_row(host, p, found[:i]) for host, found in proofs.items() for i, p in enumerate(found)]
    if not rows:
        return f"no host of {len(proofs)} climbed the context ladder"
    widths = [max(len(r[i]) for r in [list(COLUMNS), *rows]) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [list(COLUMNS), *rows]]
    return "\n".join(lines)
