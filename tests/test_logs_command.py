"""``kimi-deploy logs INVENTORY [HOST] [UNIT]``: the journals of the units the plan puts on each host,
read over pyinfra's own connection. What the command names is checked against the plan before any
host is reached (one line naming what it has instead), the ``journalctl`` line is quoted word by
word and run as pyinfra runs a command on that host (its ``_sudo`` data), and each line a host sends
is printed escaped, prefixed with its host when there are several."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from kimi_deploy.errors import ConfigError
from kimi_deploy.serving.journals import journal_command, journal_targets
from kimi_pyinfra import logs_command
from kimi_pyinfra.cli import build_parser, main
from kimi_pyinfra.inventory_file import pyinfra_inventory
from tests.conftest import PROD

UNITS = {"gpu-1": ["kimi-vllm", "kimi-watchdog"], "rt-1": ["kimi-router", "kimi-gateway"]}


def test_every_host_and_unit_of_the_plan_by_default_else_the_host_or_unit_named() -> None:
    assert journal_targets("inv.py", UNITS) == UNITS
    assert journal_targets("inv.py", UNITS, "rt-1") == {"rt-1": ["kimi-router", "kimi-gateway"]}
    assert journal_targets("inv.py", UNITS, "rt-1", "kimi-gateway") == {"rt-1": ["kimi-gateway"]}
    assert journal_targets("inv.py", UNITS, "rt-1", "kimi-gateway.service") == {"rt-1": ["kimi-gateway"]}


def test_a_host_or_unit_the_plan_does_not_put_there_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as host:
        journal_targets("inv.py", UNITS, "gpu-9")
    assert str(host.value) == "inv.py: host gpu-9: not a host of the plan: expected one of gpu-1, rt-1"
    with pytest.raises(ConfigError) as unit:
        journal_targets("inv.py", UNITS, "gpu-1", "kimi-router")
    assert str(unit.value) == (
        "inv.py: host gpu-1: no unit kimi-router of the plan there: expected one of kimi-vllm, kimi-watchdog"
    )
    many = {f"h{i:02}": ["u"] for i in range(12)}
    with pytest.raises(ConfigError, match=r"expected one of h00, .*, h07 and 4 more$"):
        journal_targets("inv.py", many, "nope")


def test_the_journalctl_line_quotes_each_word_and_follows_on_request() -> None:
    line = journal_command(["kimi-vllm", "kimi-watchdog"], 20, follow=True)
    assert shlex.split(line) == [
        "journalctl",
        "--no-pager",
        "--output=short-iso",
        "--lines=20",
        "--follow",
        "--unit=kimi-vllm",
        "--unit=kimi-watchdog",
    ]
    assert "--follow" not in journal_command(["kimi-vllm"], 5, follow=False)
    assert shlex.split(journal_command(["a b;reboot"], 5, follow=False))[-1] == "--unit=a b;reboot"


def test_the_units_of_each_host_are_the_ones_its_converge_starts() -> None:
    units = logs_command.planned_units(pyinfra_inventory(PROD), PROD)
    assert units["b300-01"] == ["kimi-vllm", "kimi-watchdog"]
    assert units["gb300-rt01"] == ["kimi-mooncake-master", "kimi-router", "kimi-gateway"]
    assert list(units)[:2] == ["b300-01", "gb300-p01"]


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["gpu-9"], "inventories/prod.py: host gpu-9: not a host of the plan: expected one of b300-01, gb300-p01,"),
        (["b300-01", "kimi-router"], "inventories/prod.py: host b300-01: no unit kimi-router of the plan there:"),
        (["b300-01", "-n", "-1"], "-n: expected a number of lines >= 0, found -1"),
        (["--data", "kimi_recipe"], "--data: expected KEY=VALUE, found 'kimi_recipe'"),
    ],
)
def test_the_command_refuses_before_it_reaches_any_host(
    words: list[str], said: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_host(*args: Any) -> int:
        raise AssertionError("a host was reached")

    monkeypatch.setattr(logs_command, "_follow", no_host)
    assert main(["logs", PROD, *words, "--no-follow"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said)
    assert err.count("\n") == 1


def test_the_cli_takes_the_lines_and_no_follow() -> None:
    args = build_parser().parse_args(["logs", PROD, "b300-01", "kimi-vllm", "-n", "3", "--no-follow"])
    assert (args.host, args.unit, args.lines, args.no_follow) == ("b300-01", "kimi-vllm", 3, True)
    args = build_parser().parse_args(["logs", PROD])
    assert (args.host, args.unit, args.lines, args.no_follow, args.data) == (None, None, 10, False, [])


class _Channel:
    def __init__(self, lines: list[bytes], status: int) -> None:
        self.lines, self.status = lines, status
        self.ran: list[str] = []
        self.combined = self.closed = False

    def set_combine_stderr(self, combine: bool) -> None:
        self.combined = combine

    def exec_command(self, command: str) -> None:
        self.ran.append(command)

    def makefile(self, mode: str) -> list[bytes]:
        assert mode == "rb"
        return self.lines

    def recv_exit_status(self) -> int:
        return self.status

    def close(self) -> None:
        self.closed = True


class _Client:
    """paramiko's SSHClient as pyinfra's SSH connector holds it, with one channel."""

    def __init__(self, channel: _Channel) -> None:
        self.channel = channel

    def get_transport(self) -> Any:
        return self

    def open_session(self) -> _Channel:
        return self.channel


def _host(data: dict[str, Any], channel: _Channel) -> tuple[State, Any]:
    inventory = Inventory((["gpu-1"], data))  # type: ignore[no-untyped-call]
    state = State(check_for_changes=False)
    state.init(inventory, Config())  # type: ignore[no-untyped-call]
    host = inventory.get_host("gpu-1")
    host.connector = type("Connector", (), {"client": _Client(channel)})()
    return state, host


def test_each_line_a_host_sends_is_printed_escaped_with_its_host(capsys: pytest.CaptureFixture[str]) -> None:
    channel = _Channel([b"started kimi-vllm\n", b"\x1b]0;owned\x07 \xff bytes\r\n", b"last, unterminated"], 0)
    state, host = _host({}, channel)
    command = journal_command(["kimi-vllm"], 10, follow=True)
    assert logs_command._follow(state, host, command, "[gpu-1] ") == 0
    assert capsys.readouterr().out.splitlines() == [
        "[gpu-1] started kimi-vllm",
        "[gpu-1] \\x1b]0;owned\\x07 \ufffd bytes",
        "[gpu-1] last, unterminated",
    ]
    # one command, stderr with stdout, the channel closed once read
    assert channel.combined
    assert channel.closed
    assert channel.ran == [f"sh -c {shlex.quote(command)}"]


def test_the_hosts_sudo_data_is_honoured_and_a_failed_journalctl_is_its_exit_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    channel = _Channel([b"No journal files were found.\n"], 1)
    state, host = _host({"_sudo": True}, channel)
    assert logs_command._follow(state, host, journal_command(["kimi-vllm"], 10, follow=False), "") == 1
    assert capsys.readouterr().out == "No journal files were found.\n"
    assert channel.ran[0].startswith("sudo ")
    assert "journalctl --no-pager" in channel.ran[0]
