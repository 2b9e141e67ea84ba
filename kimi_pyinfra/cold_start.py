"""The cold start of each host, timed on the controller: one table at the end of the run.

Every operation of the run is timed on each host that has it, from its start
(``operation_start``, once for all hosts) to that host's success or error; the times add up by
phase (``kimi_deploy.converge.cold_start``). Once the run's last step ended, or the run ended
another way (every host failed, a signal stopped it), and at least one host took a step that
changed something or failed, one headline and one table, a row per such host, say how long each
phase took; the figures stay in the run context (``RunContext.cold_start``). With ``--serial`` or
``--no-wait`` pyinfra starts no operation for all hosts at once, and nothing is timed.
"""

from __future__ import annotations

import time

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State

from kimi_deploy.converge.cold_start import (
    HostColdStart,
    Outcome,
    Phase,
    cold_start_lines,
    engine_start_lines,
    phase_of,
)
from kimi_pyinfra.stop_signals import step_name


class ColdStartTimes(BaseStateCallback):
    """Each host's seconds by phase, from pyinfra's callbacks; the table once the run ends."""

    def __init__(self, figures: dict[str, HostColdStart]) -> None:
        # host name -> its figures, filled when the run ends (the run context's)
        self.figures = figures
        self.started: dict[str, float] = {}  # operation hash -> when it started
        self.last: str | None = None  # the run's last operation, once the operations begin
        self.seconds: dict[str, dict[Phase, float]] = {}
        self.failed_in: dict[str, Phase] = {}  # host name -> the phase of its last error
        # host name -> unit -> the engine's own figures of its last start (``hostside.start_phases``)
        self.engines: dict[str, dict[str, dict[str, float]]] = {}
        self.shown = False

    def operation_start(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        if self.last is None:
            order = state.get_op_order()  # type: ignore[no-untyped-call]
            self.last = order[-1] if order else ""
        self.started[op_hash] = time.monotonic()

    def _took(self, state: State, host: Host, op_hash: str) -> Phase | None:
        started = self.started.get(op_hash)
        if started is None:
            return None
        phase = phase_of(step_name(state, op_hash))
        took = self.seconds.setdefault(host.name, {})
        took[phase] = took.get(phase, 0.0) + time.monotonic() - started
        return phase

    def operation_host_success(self, state: State, host: Host, op_hash: str, retry_count: int = 0) -> None:  # type: ignore[override]
        self._took(state, host, op_hash)

    def operation_host_error(  # type: ignore[override]
        self, state: State, host: Host, op_hash: str, retry_count: int = 0, max_retries: int = 0
    ) -> None:
        phase = self._took(state, host, op_hash)
        if phase is not None:
            self.failed_in[host.name] = phase

    def operation_end(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        self.started.pop(op_hash, None)
        if op_hash == self.last:
            self.show(state, ended=True)

    def host_disconnect(self, state: State, host: Host) -> None:  # type: ignore[override]
        # pyinfra disconnects every host once the run ends, however it ended; a host an operation
        # disconnects while it runs (a reboot) is still executing that operation.
        if state.is_executing and host.executing_op_hash is None:
            self.show(state, ended=False)

    def show(self, state: State, *, ended: bool) -> None:
        """The figures of the hosts that took a step, into the run context, and their table."""
        if self.shown:
            return
        self.shown = True
        failed = {h.name for h in state.failed_hosts}
        for host in state.inventory:
            took = self.seconds.get(host.name)
            if took is None:
                continue
            if host.name not in failed and not _changed(state, host):
                continue
            outcome: Outcome = "failed" if host.name in failed else "serving" if ended else "stopped"
            failed_in = self.failed_in.get(host.name, "other") if outcome == "failed" else None
            self.figures[host.name] = HostColdStart(host.name, dict(took), outcome, failed_in)
        for line in cold_start_lines(list(self.figures.values())):
            logger.info(line)
        for line in engine_start_lines(self.engines):
            logger.info(line)


def _changed(state: State, host: Host) -> bool:
    """Whether a step of the run changed something on ``host``."""
    for op_hash in state.ops.get(host, {}):
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        if meta.is_complete() and meta.did_change():
            return True
    return False


def engine_starts(state: State, host: Host, said: object) -> None:
    """Keep what ``host``'s engines said of their last start (the record's answer, from the host:
    numbers by phase by unit, anything else dropped) for the end of the run's table."""
    times = next((h for h in state.callback_handlers if isinstance(h, ColdStartTimes)), None)
    if times is None or not isinstance(said, dict):
        return
    kept = {}
    for unit, figures in list(said.items())[:8]:
        if isinstance(unit, str) and isinstance(figures, dict):
            good = {k: float(v) for k, v in figures.items() if isinstance(k, str) and _seconds(v)}
            if good:
                kept[unit[:64]] = good
    if kept:
        times.engines[host.name] = kept


def _seconds(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e7


def so_far(state: State, host: Host) -> HostColdStart | None:
    """``host``'s figures so far this run (its steps that ended), None when nothing is timed."""
    times = next((h for h in state.callback_handlers if isinstance(h, ColdStartTimes)), None)
    took = times.seconds.get(host.name) if times is not None else None
    return HostColdStart(host.name, dict(took)) if took else None


def install(state: State, figures: dict[str, HostColdStart]) -> None:
    """Time this run's hosts into ``figures`` (the run context's) and print their table at the end
    (once per state: the deploy file loads once for each host)."""
    if not any(isinstance(h, ColdStartTimes) for h in state.callback_handlers):
        state.add_callback_handler(ColdStartTimes(figures))  # type: ignore[no-untyped-call]
