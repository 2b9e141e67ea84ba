"""Which release each host goes back to, from the hosts' own release logs.

Pure: decided on the controller from every host's probe before any change. A rollback undoes the
latest converge: the hosts whose current release that run switched go back to the release they
last served before it; hosts it did not change are left alone. A log entry is
``[time, release folder, outcome, run id]`` with outcome ``switched``, ``serving`` (its smoke tests
passed) or ``rolled-back``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


class RollbackError(ValueError):
    """A host cannot go back: the message is one line naming the host, the release and what is gone."""


@dataclass(frozen=True)
class Rollback:
    """One host's part: ``target`` (None: nothing to do, ``why`` says why) and its record."""

    target: str | None
    # a release record as the host kept it (any format a release had): read with .get where used
    record: dict[str, Any]
    why: str = ""


def latest_run(logs: Iterable[Sequence[Sequence[str]]]) -> str | None:
    """The id of the latest run that switched a release on any host (ids sort by start time)."""
    runs = [entry[3] for log in logs for entry in log if entry[2] == "switched" and entry[3]]
    return max(runs) if runs else None


# ``record``: a release record as the host kept it, read with .get
def describe(record: dict[str, Any]) -> str:
    """``vllm 0.34.0, weights 23eb01d77aab`` for messages."""
    what = f"{record.get('engine')} {record.get('engine_version')}"
    revision = record.get("revision")
    return f"{what}, weights {revision[:12]}" if revision else what


def plan_rollback(
    host: str,
    current: str | None,
    entries: Sequence[Sequence[str]],
    # the host's release records by folder, as its probe read them (any format a release had)
    records: dict[str, Any],
    run: str | None,
) -> Rollback:
    """``host``'s rollback; ``RollbackError`` when the release to go back to is not whole on it."""
    switched = [i for i, e in enumerate(entries) if e[1] == current and e[2] == "switched" and run and e[3] == run]
    if not switched:
        return Rollback(None, {}, f"{host}: the latest converge did not change this host's release")
    before = entries[: switched[-1]]
    target = next((e[1] for e in reversed(before) if e[2] == "serving" and e[1] != current), None)
    if target is None:
        raise RollbackError(f"{host}: no earlier release served on this host: nothing to roll back to")
    found = records.get(target)
    if not found or not found.get("record"):
        raise RollbackError(f"{host}: rollback target {target} is no longer on this host")
    # as the host kept it: each field checked where it is used
    record: dict[str, Any] = found["record"]
    gone = []
    if record.get("format", 1) < 2:
        gone.append("it predates the records a rollback needs; converge with its pins instead")
    if not found.get("engine"):
        gone.append("its engine release is gone")
    if found.get("model") is False:
        drafts = [c for link, c in (record.get("checkpoints") or {}).items() if link != "model" and isinstance(c, dict)]
        what = ", ".join(f"{c.get('repo')}@{str(c.get('revision'))[:12]}" for c in drafts)
        # the model's revision or a draft's: the probe says only that one of them is not whole
        gone.append(f"its weights revision {str(record.get('revision'))[:12]}{f' or {what}' if what else ''} is gone")
    if not found.get("files"):
        gone.append("the copies of its files are gone")
    if gone:
        raise RollbackError(f"{host}: rollback target {target} ({describe(record)}): {'; '.join(gone)}")
    return Rollback(target, record)


def pins_line(host: str, rollback: Rollback) -> str:
    """What the operator commits so that the next converge keeps the rolled-back release."""
    pins = ", ".join(f"{k}: {v}" for k, v in sorted(rollback.record.get("pins", {}).items()))
    return f"{host}: back to {describe(rollback.record)}; to keep it, set in the recipe: {pins}"
