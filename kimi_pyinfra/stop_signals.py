"""Ctrl-C and SIGTERM on a converge: the step under way ends on every host, then the run stops.

pyinfra's own answer to SIGINT ends the process wherever it is, in the middle of a step on some
hosts, with exit status 0 ("Exiting upon user request!"), and SIGTERM kills it at once; either
way nothing says what each host was left in. Once ``install`` ran (the deploy file calls it while
it loads), the first SIGINT or SIGTERM during the operations lets the step under way finish on
every host and starts no other; then one line names the signal and the last step, one line per
host of the run names the steps that changed it in this run (and, when a ``Services`` step
(re)started something no later ``Smoke test`` step checked there, says that the next converge
waits for it before restarting anything else), and the run exits with status 128 + the signal's
number (130 for SIGINT, 143 for SIGTERM). A second signal while it waits stops at once, saying
which step was cut short where; so does any signal before the operations begin (facts, the
deploy files loading) or after the last step ended.

The stop is raised from the ``operation_end`` callback, which pyinfra calls in its main greenlet
once every host's greenlet for the step has returned: the ``SystemExit`` leaves ``run_ops`` before
the next step starts, passes pyinfra's CLI (which converts only ``Exception``), whose ``finally``
still disconnects the hosts, and ends the process with its code. A signal's Python handler runs in
whichever greenlet is current; the first only records the request, and the ``SystemExit`` of an
immediate stop is thrown into the main greenlet by gevent's hub (as with pyinfra's own handler),
after the hosts' greenlets still at work are killed (else the disconnect waits for their pool
slots, until their commands end): the controller stops waiting, while a command already sent goes
on where it runs until it ends by itself.
pyinfra's gevent-level SIGINT watcher (``gevent.signal_handler(SIGINT, gevent.kill)``) never
fires: libev installs its C handler when the watcher starts, and pyinfra's ``signal.signal``,
made after it, replaces it process-wide, as does ``install``'s.

A step ends on every host before the next starts in pyinfra's default order only, the converge's;
with ``--serial`` or ``--no-wait`` there is no such point, and a signal stops the run at once.
"""

from __future__ import annotations

import signal
from types import FrameType

from pyinfra import logger
from pyinfra.api.host import Host
from pyinfra.api.state import BaseStateCallback, State
from pyinfra.context import ContextObject

SIGNALS = (signal.SIGINT, signal.SIGTERM)
SERVICES = "Services"
SMOKE_TEST = "Smoke test"


def step_name(state: State, op_hash: str) -> str:
    """The operation's name as pyinfra prints it (its names, joined when it has several)."""
    return ", ".join(sorted(state.get_op_meta(op_hash).names))


class StopOnSignal(BaseStateCallback):
    """The run's signal handler and the callbacks that stop it between two steps."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.signum: int | None = None  # the stop asked for, until it is made
        self.under_way: str | None = None  # between operation_start and operation_end
        self.order: list[str] | None = None  # the steps of the run, once they begin
        self.ended: list[str] = []
        self.per_host = False  # --serial or --no-wait: no operation_start or operation_end
        self.reported = False

    # The signal handler.

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is None and self._can_wait():
            self.signum = signum
            logger.warning(
                f"kimi-deploy: {name}: stopping once the step under way ends on every host ({name} again stops now)"
            )
            return
        self._stop_now(signum)

    def _can_wait(self) -> bool:
        """A stop can wait for the step under way: the operations run, and a step is left to end."""
        if not self.state.is_executing or self.per_host or self.reported:
            return False
        return self.order is None or len(self.ended) < len(self.order)

    # pyinfra's callbacks (BaseStateCallback declares them static; pyinfra calls them on the
    # instance with the state first).

    def operation_start(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        if self.order is None:
            self.order = state.get_op_order()  # type: ignore[no-untyped-call]
        if self.signum is not None:  # asked for between two steps: this one does not start
            self._stop_after(self.ended[-1] if self.ended else None, self.signum)
        self.under_way = op_hash

    def operation_end(self, state: State, op_hash: str) -> None:  # type: ignore[override]
        self.under_way = None
        self.ended.append(op_hash)
        if self.signum is None:
            return
        # The handlers after this one end the step first (fleet_progress prints its line for it):
        # raising here skips them.
        handlers = state.callback_handlers
        for handler in handlers[handlers.index(self) + 1 :]:
            handler.operation_end(state, op_hash)
        self._stop_after(op_hash, self.signum)

    def operation_host_start(self, state: State, host: Host, op_hash: str) -> None:  # type: ignore[override]
        if self.under_way is None:
            self.per_host = True
            if self.signum is not None:
                self._stop_now(self.signum)

    def host_disconnect(self, state: State, host: Host) -> None:  # type: ignore[override]
        # The run ended another way (all hosts failed, say) while a stop waited: still say what
        # each host was left in, once; pyinfra's own error sets the exit status.
        if self.signum is not None and not self.reported:
            self.reported = True
            name = signal.Signals(self.signum).name
            logger.warning(f"kimi-deploy: {name}: the run ended before the stop it asked for")
            self._host_lines(cut=None)

    # The stops.

    def _stop_after(self, op_hash: str | None, signum: int) -> None:
        name = signal.Signals(signum).name
        order = self.order or []
        if op_hash is None:
            said = "before the first step; no step ran"
        else:
            done = order.index(op_hash) + 1 if op_hash in order else len(self.ended)
            left = len(order) - done
            said = f"after step {step_name(self.state, op_hash)!r} ({done} of {len(order)})"
            said += f"; the {left} later steps did not run" if left != 1 else "; the 1 later step did not run"
        logger.warning(f"kimi-deploy: {name}: stopped {said}")
        self.reported = True
        self._host_lines(cut=None)
        raise SystemExit(128 + signum)

    def _stop_now(self, signum: int) -> None:
        name = signal.Signals(signum).name
        again = " again" if self.signum is not None else ""
        if self.reported:
            logger.warning(f"kimi-deploy: {name}{again}: stopping now")
        elif self.under_way is not None:
            step = step_name(self.state, self.under_way)
            logger.warning(
                f"kimi-deploy: {name}{again}: stopping now; step {step!r} is cut short where it had not ended "
                "(what it did there is unknown)"
            )
        elif self.per_host and self.state.is_executing:
            logger.warning(f"kimi-deploy: {name}{again}: stopping now; the steps under way were cut short")
        elif self.state.is_executing:
            logger.warning(f"kimi-deploy: {name}{again}: stopping now, no step under way")
        else:
            logger.warning(f"kimi-deploy: {name}: stopping now, before any step ran")
        if self.state.is_executing and not self.reported:
            self.reported = True
            self._host_lines(cut=self.under_way)
        # The hosts' greenlets still at work end here (they would hold pyinfra's pool, whose slots
        # the disconnect waits for, until their commands ended).
        if self.state.pool is not None:
            self.state.pool.kill(block=False)
        raise SystemExit(128 + signum)

    def _host_lines(self, cut: str | None) -> None:
        """One line per host of the run: the steps that changed it, in order, or that none did."""
        state = self.state
        order = self.order if self.order is not None else state.get_op_order()  # type: ignore[no-untyped-call]
        for host in (h for h in state.inventory if h in state.activated_hosts):
            ops = state.ops.get(host, {})
            changed: list[str] = []
            unchecked: str | None = None  # the last Services step that changed it, until a smoke test passes
            for op_hash in order:
                if op_hash not in ops:
                    continue
                meta = state.get_op_data_for_host(host, op_hash).operation_meta
                if not meta.is_complete():
                    continue
                name = step_name(state, op_hash)
                if meta.did_change():
                    changed.append(name)
                    if name.startswith(SERVICES):
                        unchecked = name
                if name.startswith(SMOKE_TEST) and meta.did_succeed():
                    unchecked = None
            line = f"changed by: {', '.join(changed)}" if changed else "no step changed it in this run"
            if (
                cut is not None
                and cut in ops
                and not state.get_op_data_for_host(host, cut).operation_meta.is_complete()
            ):
                line += f"; step {step_name(state, cut)!r} was cut short here"
            if unchecked is not None:
                line += (
                    f"; what {unchecked!r} (re)started is not smoke-tested yet: the next converge waits for it "
                    "before restarting anything else"
                )
            if host in state.failed_hosts:
                line += "; a step failed here"
            logger.warning(f"kimi-deploy: [{host.name}] {line}")


def install(state: State) -> None:
    """SIGINT and SIGTERM stop the run between two steps (once per state: the deploy file loads
    once for each host). Call it from the main thread, as the deploy file runs."""
    if isinstance(state, ContextObject):  # pyinfra.context's proxy: the handler keeps the state itself
        state = state._get_module()  # type: ignore[no-untyped-call]
    if any(isinstance(h, StopOnSignal) for h in state.callback_handlers):
        return
    stop = StopOnSignal(state)
    state.add_callback_handler(stop)  # type: ignore[no-untyped-call]
    for signum in SIGNALS:
        signal.signal(signum, stop.on_signal)
