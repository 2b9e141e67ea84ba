"""Progress at fleet size: one line per step of the converge, not one per host and step.

pyinfra prints a line for every host of every operation ("[kimi-h12] No changes"), and the
converge one per host for its plan and its rehearsal: 64 hosts make a log of thousands of
lines where the few that matter hide. Unless pyinfra runs with ``-v`` (then everything it says
stays), a converge instead prints, per operation, pyinfra's own line when it starts and one
line when it ends: how many hosts it changed, left unchanged or failed, and how long it took;
while it runs longer than ``TICK_S``, a line every ``TICK_S`` with the hosts done, failed and
pending, and, for a step whose host program keeps a progress file (the weights sync, the release
install), the bytes summed over its hosts, the rate, the time left and the slowest host
(``kimi_deploy.host.fleet_bytes``, read by ``kimi_pyinfra.progress_reads``). ``--data
kimi_progress_tick_s=SECONDS`` sets the tick. What a host says when something goes wrong
(warnings, errors, the failing command's output) is never held back, but for what a failed host
program says twice (``kimi_pyinfra.failure_lines``).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import gevent  # type: ignore[import-untyped]
from pydantic import ValidationError
from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State

from kimi_deploy.host.fleet_bytes import FleetBytes
from kimi_deploy.inventory import HostVars
from kimi_deploy.validation_error import first_error_line
from kimi_pyinfra.failure_lines import FailureLines
from kimi_pyinfra.progress_reads import READ_S, read_all

TICK_S = 15.0
# ``--data kimi_progress_tick_s``: another tick (the tests shorten it to see a short step tick)
TICK_DATA = "kimi_progress_tick_s"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The per-host lines a step line replaces: pyinfra's result of each operation on each host and
# its "ready" per deploy file, the converge's own plan and rehearsal lines per host. pyinfra's
# own line per operation ("--> Starting operation: ...") stays.
_PER_HOST = re.compile(r"^\s*\[[^\]]+\]\s+(Success|No changes|Skipped|Ready:|plan:|converged, no step to take)")


class PerHostLines(logging.Filter):
    """Drops the informational per-host lines that the step lines sum up."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            return True
        return _PER_HOST.search(_ANSI.sub("", record.getMessage())) is None


def tick_seconds(where: str, value: object) -> float:
    """The tick ``--data kimi_progress_tick_s`` asks for (None: ``TICK_S``), by the inventory's
    rule for it (``kimi_deploy.inventory.HostVars``); ``ConfigError`` naming ``where`` otherwise."""
    if value is None:
        return TICK_S
    try:
        seconds = HostVars.model_validate({TICK_DATA: value}).kimi_progress_tick_s
    except ValidationError as exc:
        raise first_error_line(where, exc, HostVars) from None
    return TICK_S if seconds is None else seconds


@dataclass
class _Step:
    name: str
    op_hash: str
    hosts: list[Host]
    started: float
    done: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    ticker: Any = None
    moved: FleetBytes = field(default_factory=FleetBytes)


class StepLines(BaseStateCallback):
    """One line per operation of the run (``operation_start`` .. ``operation_end``)."""

    def __init__(self, tick_s: float = TICK_S, progress_files: dict[tuple[str, str], str] | None = None) -> None:
        self.steps: dict[str, _Step] = {}
        self.tick_s = tick_s
        # (host name, operation hash) -> its progress file (the run context's, filled by operations)
        self.progress_files = {} if progress_files is None else progress_files

    def operation_start(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        hosts = [h for h in state.inventory.get_active_hosts() if op_hash in state.ops.get(h, {})]
        name = ", ".join(sorted(state.get_op_meta(op_hash).names))
        step = self.steps[op_hash] = _Step(name, op_hash, hosts, time.monotonic())
        step.ticker = gevent.spawn(self._tick, step)

    def operation_host_success(self, state: State, host: Host, op_hash: str, retry_count: int = 0) -> None:  # type: ignore[override]
        if op_hash in self.steps:
            self.steps[op_hash].done.add(host.name)

    def operation_host_error(  # type: ignore[override]
        self, state: State, host: Host, op_hash: str, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        if op_hash in self.steps:
            self.steps[op_hash].failed.add(host.name)

    def operation_end(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        step = self.steps.pop(op_hash, None)
        if step is None:
            return
        step.ticker.kill(block=False)
        for h in step.hosts:
            self.progress_files.pop((h.name, op_hash), None)
        changed = 0
        for h in step.hosts:
            meta = state.get_op_data_for_host(h, op_hash).operation_meta
            changed += bool(meta.is_complete() and meta.did_change())
        failed = sorted(step.failed)
        unchanged = len(step.done) - changed
        said = f"{changed} changed, {unchanged} unchanged, {len(failed)} failed"
        if failed:
            said += f" ({listed(failed)})"
        logger.info(f"--> {step.name}: {said} of {len(step.hosts)} hosts in {time.monotonic() - step.started:.1f} s")

    def _tick(self, step: _Step) -> None:
        while True:
            gevent.sleep(self.tick_s)
            moved = self._moved(step)
            pending = len(step.hosts) - len(step.done) - len(step.failed)
            logger.info(
                f"    {step.name}: {len(step.done)} done, {len(step.failed)} failed, {pending} pending "
                f"({time.monotonic() - step.started:.0f} s){'; ' + moved if moved else ''}"
            )

    def _moved(self, step: _Step) -> str | None:
        """The bytes part of the step's line: the progress files of its busy hosts read now."""
        busy = [
            (h, path)
            for h in step.hosts
            if h.name not in step.done
            and h.name not in step.failed
            and (path := self.progress_files.get((h.name, step.op_hash))) is not None
        ]
        if not busy and not step.moved.readings:
            return None
        try:
            readings = read_all(busy, min(READ_S, max(self.tick_s, 1.0))) if busy else {}
            return step.moved.tick(time.monotonic(), readings, step.done, step.failed)
        except Exception:  # noqa: BLE001 - progress is for show: the step line goes on without it
            return None


def listed(hosts: list[str], most: int = 8) -> str:
    """``hosts`` as one line names them: the first ``most``, then how many more."""
    return ", ".join(hosts[:most]) + (f" and {len(hosts) - most} more" if len(hosts) > most else "")


def install(state: State, tick_s: float = TICK_S, progress_files: dict[tuple[str, str], str] | None = None) -> None:
    """Step lines for this run instead of per-host ones, a tick line every ``tick_s`` with the
    bytes of the hosts' ``progress_files`` (the run context's), and a failed host program's reason
    alone, unless pyinfra runs with ``-v``."""
    if state.print_noop_info:
        return
    state.add_callback_handler(StepLines(tick_s, progress_files))  # type: ignore[no-untyped-call]
    for handler in logging.getLogger("pyinfra").handlers:
        if not any(isinstance(f, PerHostLines) for f in handler.filters):
            handler.addFilter(PerHostLines())
        if not any(isinstance(f, FailureLines) for f in handler.filters):
            handler.addFilter(FailureLines())
