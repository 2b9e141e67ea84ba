"""kimi_pyinfra.dead_peers: the kernel's bounds on the SSH connection's socket, and a command on a
connection that closed failing on its host alone with one line. The whole of it, a host taken off
the network during a real converge, is ``tests/e2e/test_demo_commcheck.py``'s."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from pyinfra.connectors.util import CommandOutput, OutputLine

from kimi_pyinfra.dead_peers import BOUND_S, COUNT, IDLE_S, INTERVAL_S, LOST, bound


@pytest.fixture
def connected() -> Iterator[socket.socket]:
    """A TCP connection over loopback, as paramiko's transport holds one."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        try:
            yield client
        finally:
            client.close()
            peer.close()


@dataclass
class Transport:
    sock: socket.socket
    active: bool = True

    def is_active(self) -> bool:
        return self.active


@dataclass
class Client:
    transport: Transport

    def get_transport(self) -> Transport:
        return self.transport


@dataclass
class Connector:
    client: Client
    answers: list[Any] = field(default_factory=list)

    def run_shell_command(self, *args: Any, **kwargs: Any) -> tuple[bool, CommandOutput]:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


@dataclass
class Host:
    name: str
    connector: Connector


def test_the_socket_gets_keepalive_probes_and_a_bound_on_unacknowledged_data(connected: socket.socket) -> None:
    host = Host("kimi-h4", Connector(Client(Transport(connected))))
    assert bound(host)
    assert connected.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == IDLE_S
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == INTERVAL_S
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == COUNT
    assert connected.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == BOUND_S * 1000
    assert BOUND_S <= 60


def test_a_command_on_a_closed_connection_fails_on_its_host_with_one_line(connected: socket.socket) -> None:
    transport = Transport(connected)
    failed = CommandOutput([OutputLine("stdout", "partial")])
    host = Host("kimi-h4", Connector(Client(transport), [(True, CommandOutput([])), EOFError(), (False, failed)]))
    assert bound(host)
    assert bound(host)  # twice: wrapped once
    assert host.connector.run_shell_command("true")[0] is True
    transport.active = False
    # paramiko's EOFError, which pyinfra does not catch, becomes the host's failure
    ok, output = host.connector.run_shell_command("true")
    assert (ok, output.stderr_lines) == (False, [f"kimi-deploy: kimi-h4: {LOST}"])
    # a command cut with no status keeps what it printed, and says why
    ok, output = host.connector.run_shell_command("true")
    assert (ok, output.output_lines) == (False, ["partial", f"kimi-deploy: kimi-h4: {LOST}"])


def test_a_failure_on_a_live_connection_is_left_as_it_is(connected: socket.socket) -> None:
    failed = CommandOutput([OutputLine("stderr", "apt-get: E: broken")])
    host = Host("kimi-h1", Connector(Client(Transport(connected)), [(False, failed), EOFError()]))
    assert bound(host)
    assert host.connector.run_shell_command("apt-get")[1].output_lines == ["apt-get: E: broken"]
    # an EOFError with the connection still up is no host gone: the failure, without the line
    assert host.connector.run_shell_command("true") == (False, CommandOutput([]))


def test_a_host_without_an_ssh_socket_is_left_alone() -> None:
    assert not bound(object())
    assert not bound(Host("@local", Connector(None)))  # type: ignore[arg-type]
