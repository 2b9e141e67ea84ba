"""How long an engine's last start spent loading and compiling, in its own words (its journal).

``phases(unit, asked)``: the unit's journal since systemd last started it (``journalctl -u UNIT -o
short-unix``, its last ``Started`` line on), and for each phase asked, the first of its readings
that the log gives: ``{"took": PATTERN}``, the seconds the engine printed (the pattern's first
group: ``Loading weights took 0.03 seconds``), or ``{"between": [A, B]}``, the time from the first
line matching A to the first matching B after it. ``ready`` is always read: from the ``Started``
line to the first line matching the ``ready`` pattern. The engine wrote these lines: each is read
within bounds (``MOST_LINES`` lines, ``LINE_BYTES`` of each), the patterns are the controller's
(``kimi_deploy.engines``: each engine's own lines, cited there), and a figure is a finite,
non-negative number or nothing.
"""

from __future__ import annotations

import math
import re
import subprocess

MOST_LINES = 20000
LINE_BYTES = 2048
JOURNAL_S = 15


def _journal(unit: str) -> list[tuple[float, str]]:
    """(time, message) of the unit's journal lines since its last start (none: no start found)."""
    try:
        done = subprocess.run(
            ["journalctl", "-u", unit, "-o", "short-unix", "--no-pager", "-n", str(MOST_LINES)],
            capture_output=True,
            timeout=JOURNAL_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    lines: list[tuple[float, str]] = []
    for raw in done.stdout.splitlines()[-MOST_LINES:]:
        stamp, _, rest = raw[:LINE_BYTES].decode("utf-8", errors="replace").partition(" ")
        try:
            lines.append((float(stamp), rest))
        except ValueError:
            continue
    started = [i for i, (_, text) in enumerate(lines) if f"Started {unit}.service" in text]
    return lines[started[-1] :] if started else []


def _took(lines: list[tuple[float, str]], pattern: str) -> float | None:
    found = re.compile(pattern)
    for _, text in lines:
        match = found.search(text)
        if match:
            try:
                value = float(match.group(1))
            except (IndexError, ValueError):
                return None
            return value if math.isfinite(value) and value >= 0 else None
    return None


def _between(lines: list[tuple[float, str]], first: str, then: str) -> float | None:
    begun = next((t for t, text in lines if re.search(first, text)), None)
    if begun is None:
        return None
    ended = next((t for t, text in lines if t >= begun and re.search(then, text)), None)
    return None if ended is None else max(0.0, ended - begun)


def phases(unit: str, asked: dict[str, list[dict[str, object]]], ready: str) -> dict[str, float]:
    """The phases of ``unit``'s last start the journal tells, by name, and ``ready``."""
    lines = _journal(unit)
    if not lines:
        return {}
    out: dict[str, float] = {}
    for name, readings in asked.items():
        for reading in readings:
            took, between = reading.get("took"), reading.get("between")
            if isinstance(took, str):
                value = _took(lines, took)
            elif isinstance(between, list) and len(between) == 2 and all(isinstance(p, str) for p in between):
                value = _between(lines, str(between[0]), str(between[1]))
            else:
                value = None
            if value is not None:
                out[name] = round(value, 1)
                break
    to_ready = _between(lines, r"Started ", ready)
    if to_ready is not None:
        out["ready"] = round(to_ready, 1)
    return out
