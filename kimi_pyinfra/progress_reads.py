"""The progress files of the hosts busy with a long step, read over their open SSH connections.

An operation whose host program keeps a progress file (``kimi_deploy.hostside.progress_file``:
the weights sync, the release install) names it with ``progress_at`` as it yields the command;
the step lines (``kimi_pyinfra.fleet_progress``) read it on every host still busy with that step,
once per tick, all hosts at once: one ``head`` over the connection pyinfra already holds (a
second channel beside the operation's own; no new connection, no sudo: the file is mode 0644).
Each read is bounded in bytes (``READ_BYTES``, on the host) and in time (``READ_S``, then it is
abandoned), and anything that goes wrong (no file yet, a host gone, a timeout, text that is not a
progress line) reads as no progress: a read never fails, nor waits on, the operation itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import gevent  # type: ignore[import-untyped]
from gevent.pool import Pool  # type: ignore[import-untyped]
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.host import Host
from pyinfra.context import host

from kimi_deploy.host.progress_reading import Reading, parse_progress
from kimi_deploy.hostside.progress_file import MAX_BYTES
from kimi_pyinfra.run_context import run_context

READ_BYTES = MAX_BYTES
READ_S = 5.0
# reads in flight at once, whatever the hosts
AT_ONCE = 64


def progress_at(path: str) -> None:
    """The host program of the operation under way on this host keeps its progress in ``path``
    (called from the operation's body; nothing when it runs outside pyinfra's execution of an
    operation, as a rehearsal runs it)."""
    op_hash = host.current_op_hash
    if op_hash is not None:
        run_context().progress_files[(host.name, op_hash)] = path


def read_one(target: Host, path: str, timeout_s: float = READ_S) -> Reading | None:
    """``target``'s progress in ``path``, or None."""
    try:
        command = StringCommand("head", "-c", str(READ_BYTES), QuoteString(path))
        ok, output = target.run_shell_command(command, _timeout=timeout_s)
    except gevent.GreenletExit:
        raise
    except BaseException:  # noqa: BLE001 - a timeout, a closed connection: no progress this tick
        return None
    if not ok:
        return None
    return parse_progress("\n".join(output.stdout_lines)[: READ_BYTES + 1])


def read_all(busy: Iterable[tuple[Host, str]], timeout_s: float = READ_S) -> dict[str, Reading]:
    """Each busy host's reading (host, its progress file), ``AT_ONCE`` at a time, all within
    ``timeout_s``; the hosts not read by then, or that said nothing readable, are left out."""
    deadline = time.monotonic() + timeout_s
    pool = Pool(AT_ONCE)
    reads = {}
    try:
        for target, path in busy:
            left = deadline - time.monotonic()
            if left <= 0 or not pool.wait_available(timeout=left):
                break
            reads[target.name] = pool.spawn(read_one, target, path, left)
        gevent.joinall(list(reads.values()), timeout=max(deadline - time.monotonic(), 0))
    finally:
        pool.kill(block=False)
    return {name: g.value for name, g in reads.items() if g.ready() and g.successful() and g.value is not None}
