"""A host that drops off the network during a run fails within a bound instead of holding the run.

pyinfra's SSH connection (paramiko) reads a command's output until its channel closes. A host whose
network is cut answers nothing and sends no reset: the read then waits for TCP's retransmissions
to give up (some 15 minutes) when something was sent, and forever when nothing was, while every
other host waits at the next step's barrier. The kernel bounds it: keepalive probes on an idle
connection (after ``IDLE_S``, every ``INTERVAL_S``, ``COUNT`` unanswered) and ``TCP_USER_TIMEOUT``
for data sent and not acknowledged close the socket after ``BOUND_S``; paramiko's transport then
ends the channel, the command fails, and pyinfra fails that host alone. A host that is merely busy
(a long smoke test, a download) answers the probes from its kernel: nothing bounds a long command.

A command cut so ends with no output and no exit status, and one started on a connection already
closed raises paramiko's ``EOFError``, which pyinfra does not catch (the whole run stopped with an
internal error, every host with it). ``bound`` also wraps the host's connector: either way the
command fails on that host alone, with one ``kimi-deploy:`` line naming it (``LOST``) as its output,
which pyinfra prints as a failed command's.
"""

from __future__ import annotations

import socket
from typing import Any

from pyinfra.connectors.util import CommandOutput, OutputLine

IDLE_S = 10
INTERVAL_S = 5
COUNT = 4
BOUND_S = IDLE_S + INTERVAL_S * COUNT
LOST = (
    "its SSH connection closed during this step (off the network, or down): no later step ran "
    "there, and an instance it belongs to was not restarted on its other hosts; the next converge "
    "completes it"
)


def limit(sock: socket.socket) -> None:
    """Keepalive probes and a timeout for unacknowledged data on ``sock`` (a TCP socket)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, IDLE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, INTERVAL_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, COUNT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, BOUND_S * 1000)


def bound(host: Any) -> bool:
    """``limit`` the socket of ``host``'s SSH connection; False when it has none (not connected,
    or not over TCP: the local connector, a proxy command)."""
    sock = getattr(_transport(host), "sock", None)
    if not isinstance(sock, socket.socket) or sock.type != socket.SOCK_STREAM or sock.family == socket.AF_UNIX:
        return False
    limit(sock)
    connector = host.connector
    if not getattr(connector, "kimi_guarded", False):
        run = connector.run_shell_command

        def guarded(*args: Any, **kwargs: Any) -> tuple[bool, CommandOutput]:
            try:
                ok, output = run(*args, **kwargs)
            except EOFError:
                ok, output = False, CommandOutput([])
            if not ok and lost(host):
                return False, CommandOutput([*output, OutputLine("stderr", f"kimi-deploy: {host.name}: {LOST}")])
            return ok, output

        connector.run_shell_command = guarded
        connector.kimi_guarded = True
    return True


def _transport(host: Any) -> Any:
    """paramiko's transport of ``host``'s SSH connection, None when it has none."""
    client = getattr(getattr(host, "connector", None), "client", None)
    return client.get_transport() if client is not None else None


def lost(host: Any) -> bool:
    """Whether ``host``'s SSH connection was made and is closed now."""
    transport = _transport(host)
    return transport is not None and not transport.is_active()
