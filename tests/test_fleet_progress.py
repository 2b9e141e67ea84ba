"""The step lines of a converge: pyinfra's per-host informational lines go, anything else stays; a
long step's tick line says the bytes of its busy hosts."""

from __future__ import annotations

import logging
import time
from typing import Any

import click
import gevent  # type: ignore[import-untyped]
import pytest
from pyinfra.api.command import StringCommand
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State
from pyinfra.connectors.util import CommandOutput, OutputLine

from kimi_deploy.errors import ConfigError
from kimi_deploy.host.progress_reading import Reading
from kimi_pyinfra import fleet_progress
from kimi_pyinfra.fleet_progress import TICK_S, PerHostLines, StepLines, _Step, tick_seconds
from kimi_pyinfra.progress_reads import READ_S, read_all, read_one


@pytest.fixture
def prefix() -> str:
    """A host's prefix as pyinfra prints it, colours included."""
    inventory = Inventory((["kimi-h12"], {}))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    return inventory.get_host("kimi-h12").print_prefix


def _kept(message: str, level: int = logging.INFO) -> bool:
    return PerHostLines().filter(logging.LogRecord("pyinfra", level, __file__, 1, message, None, None))


@pytest.mark.parametrize(
    "said",
    [
        click.style("No changes", "cyan"),
        click.style("Success", "green"),
        click.style("Success on retry 1", "green"),
        click.style("Skipped", "blue"),
        f"{click.style('Ready:', 'green')} {click.style('deploys/kimi.py', bold=True)}",
        "plan: topology demo-vllm, pool serve, single 0/1, units kimi-vllm",
        "converged, no step to take",
    ],
)
def test_a_hosts_routine_line_goes(prefix: str, said: str) -> None:
    assert not _kept(f"{prefix}{said}")


def test_the_lines_once_per_operation_stay() -> None:
    assert _kept(f"{click.style('--> Starting operation:', 'blue')} {click.style('Releases', bold=True)} ")
    assert _kept("--> Releases (engine, host tools): 3 changed, 61 unchanged, 0 failed of 64 hosts in 12.0 s")


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_what_goes_wrong_is_never_held_back(prefix: str, level: int) -> None:
    assert _kept(f"{prefix}{click.style('No changes', 'cyan')}", level)
    assert _kept(f"{prefix}kimi-deploy: comm check: kimi-h4 -> kimi-h3:29500 (dist_init): timed out", level)


def test_other_host_lines_stay(prefix: str) -> None:
    assert _kept(f"{prefix}kimi-deploy: weights: 96 files from peers (6233480 bytes from kimi-h1)")
    assert _kept(f"{prefix}{click.style('Connected', 'green')}")


# The tick line's bytes (kimi_pyinfra.progress_reads, kimi_deploy.host.fleet_bytes).


WHERE = "inventories/prod.py: host kimi-h1"


# pyinfra reads ``--data kimi_progress_tick_s=0.2`` as the float 0.2, ``=15`` as the int 15
@pytest.mark.parametrize(("value", "seconds"), [(None, TICK_S), (0.2, 0.2), (15, 15.0), (3600, 3600.0)])
def test_the_tick_is_fifteen_seconds_unless_the_run_says(value: object, seconds: float) -> None:
    assert tick_seconds(WHERE, value) == seconds


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0, "Input should be greater than or equal to 0.1, found int 0"),
        (0.01, "Input should be greater than or equal to 0.1, found float 0.01"),
        (-1, "Input should be greater than or equal to 0.1, found int -1"),
        (3601, "Input should be less than or equal to 3600, found int 3601"),
        (float("nan"), "Input should be a finite number"),
        ("soon", "Input should be a valid number, found str 'soon'"),
        (True, "Input should be a valid number, found bool True"),
    ],
)
def test_a_tick_out_of_bounds_is_refused_in_one_line(value: object, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        tick_seconds(WHERE, value)
    assert str(refused.value) == f"{WHERE}: kimi_progress_tick_s: {said}"


class _Host:
    """A host as a read sees it: its name and one command's answer (or what it raises)."""

    def __init__(self, name: str, answer: tuple[bool, list[str]] | BaseException) -> None:
        self.name, self.answer = name, answer
        self.commands: list[tuple[str, dict[str, Any]]] = []

    def run_shell_command(self, command: StringCommand, **arguments: Any) -> tuple[bool, CommandOutput]:
        self.commands.append((command.get_raw_value(), arguments))
        if isinstance(self.answer, BaseException):
            raise self.answer
        ok, lines = self.answer
        return ok, CommandOutput([OutputLine("stdout", line) for line in lines])


def test_a_read_is_one_bounded_head_of_the_file() -> None:
    target = _Host("kimi-h1", (True, ["412300000000 1560000000000 1767225600"]))
    found = read_one(target, "/srv/models/m/r ev/.kimi/progress")  # type: ignore[arg-type]
    assert found == Reading(412_300_000_000, 1_560_000_000_000, 1_767_225_600)
    # no sudo, no other argument: the file is readable by all; bounded on the host and in time
    assert target.commands == [("head -c 64 '/srv/models/m/r ev/.kimi/progress'", {"_timeout": READ_S})]


@pytest.mark.parametrize(
    "answer",
    [
        (False, ["head: cannot open '/x' for reading: No such file or directory"]),
        (True, ["5 4 1767225600"]),
        (True, ["1 4 1767225600", "and more"]),
        (True, ["9" * 100_000]),
        TimeoutError(),
        EOFError(),
        OSError("Socket is closed"),
        gevent.Timeout(),
    ],
    ids=["no file", "more done than in all", "two lines", "a flood", "timeout", "eof", "closed", "gevent timeout"],
)
def test_a_read_that_fails_or_says_nonsense_is_no_progress(answer: tuple[bool, list[str]] | BaseException) -> None:
    assert read_one(_Host("kimi-h1", answer), "/x") is None  # type: ignore[arg-type]


def test_reads_of_many_hosts_leave_out_the_silent_ones() -> None:
    hosts = [
        _Host("kimi-h1", (True, ["10 100 1"])),
        _Host("kimi-h2", (False, [])),
        _Host("kimi-h3", OSError("gone")),
        _Host("kimi-h4", (True, ["100 100 1"])),
    ]
    assert read_all([(h, "/p") for h in hosts]) == {"kimi-h1": Reading(10, 100, 1), "kimi-h4": Reading(100, 100, 1)}  # type: ignore[misc]


def test_a_host_that_never_answers_holds_the_tick_no_longer_than_its_bound() -> None:
    class _Hung(_Host):
        def run_shell_command(self, command: StringCommand, **arguments: Any) -> tuple[bool, CommandOutput]:
            gevent.sleep(60)
            raise AssertionError("not reached")

    started = time.monotonic()
    found = read_all([(_Hung("kimi-h1", EOFError()), "/p"), (_Host("kimi-h2", (True, ["1 2 3"])), "/p")], 0.2)  # type: ignore[list-item]
    assert found == {"kimi-h2": Reading(1, 2, 3)}
    assert time.monotonic() - started < 1.0


def test_the_tick_line_says_the_busy_hosts_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = Inventory((["kimi-h1", "kimi-h2", "kimi-h3"], {}))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    h1, h2, h3 = (inventory.get_host(n) for n in ("kimi-h1", "kimi-h2", "kimi-h3"))
    files = {("kimi-h1", "op"): "/p1", ("kimi-h2", "op"): "/p2", ("kimi-h3", "other"): "/p3"}
    asked: list[list[str]] = []

    def read(busy: list[tuple[Any, str]], timeout_s: float) -> dict[str, Reading]:
        asked.append([f"{h.name}:{path}" for h, path in busy])
        return {"kimi-h1": Reading(30, 100, 1), "kimi-h2": Reading(80, 100, 1)}

    monkeypatch.setattr(fleet_progress, "read_all", read)
    lines = StepLines(tick_s=0.2, progress_files=files)
    step = _Step("Weights at the pinned revision", "op", [h1, h2, h3], 0.0, done={"kimi-h3"})
    assert lines._moved(step) == "110 B of 200 B (100 B x 2 hosts); slowest kimi-h1 (30%)"
    # the hosts still busy with this step, each at its own file; nothing of another step's
    assert asked == [["kimi-h1:/p1", "kimi-h2:/p2"]]


def test_a_step_without_progress_files_reads_nothing_and_a_failing_read_costs_the_line_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inventory = Inventory((["kimi-h1"], {}))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    step = _Step("Engine user", "op", [inventory.get_host("kimi-h1")], 0.0)

    def broken(busy: list[tuple[Any, str]], timeout_s: float) -> dict[str, Reading]:
        raise RuntimeError("never asked")

    monkeypatch.setattr(fleet_progress, "read_all", broken)
    assert StepLines(0.2, {})._moved(step) is None
    assert StepLines(0.2, {("kimi-h1", "op"): "/p"})._moved(step) is None
