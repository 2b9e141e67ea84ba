"""What a converge tells of a host's watchdog: its units' places on the recovery ladder and what
it did since the release serving started, from the state file the host probe read.

The file comes from the host (``hostside/watchdog.py`` writes it, but anything on the host may
have): every value is checked for its type, and every text is shown through
``hostside.boundary_text.shown`` (ASCII, bounded), never as it came.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Sequence
from typing import Any

from kimi_deploy.hostside.boundary_text import shown

# A state file older than this many rounds: the watchdog is not running (or hangs).
STALE_ROUNDS = 3
STATES = ("serving", "failing", "restarting", "starting", "stopped", "drained")
ACTIONS = {"restart": "restarted", "stop": "drained"}


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def release_time(last_release: Any) -> float | None:
    """When the release log's last entry (``[UTC time, release dir, outcome]``, the probe's
    ``last_release``) was written, None when it cannot be read."""
    try:
        return float(calendar.timegm(time.strptime(str(last_release[0]), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def watchdog_lines(
    found: Any, units: Sequence[str], *, since: float | None, interval_s: int, now: float | None = None
) -> list[str]:
    """One line per unit of ``units`` not serving, per action since ``since`` (the release
    serving's start; None: every kept action), and one when the watchdog's file is missing or
    stale; nothing when all is well. ``found``: the host's state file, unchecked."""
    now = time.time() if now is None else now
    if not isinstance(found, dict):
        return ["not running: no state file yet"]
    out = []
    updated = _number(found.get("updated"))
    if updated is None or now - updated > STALE_ROUNDS * interval_s + 60:
        out.append(f"not running: its last round was {_clock(updated) if updated is not None else 'never'}")
    records = found.get("units")
    records = records if isinstance(records, dict) else {}
    for unit in units:
        record = records.get(unit)
        if not isinstance(record, dict):
            continue
        state = record.get("state")
        if state not in STATES or state == "serving":
            continue
        at = _number(record.get("since"))
        why = record.get("why")
        out.append(
            f"{unit} {state}{' since ' + _clock(at) if at is not None else ''}"
            f"{': ' + shown(why) if isinstance(why, str) else ''}"
        )
    actions = found.get("actions")
    actions = actions if isinstance(actions, list) else []
    for action in actions:
        if not isinstance(action, dict) or action.get("unit") not in units or action.get("action") not in ACTIONS:
            continue
        at = _number(action.get("at"))
        if at is None or (since is not None and at < since):
            continue
        why = action.get("why")
        said = f": {shown(why)}" if isinstance(why, str) else ""
        out.append(f"{action['unit']} {ACTIONS[action['action']]} at {_clock(at)}{said}")
    return out
