"""A failed host program reads as its ``kimi-deploy:`` line: its JSON answer and pyinfra's Error
line go, any other failure and any other line stay (``kimi_pyinfra.failure_lines``)."""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
from collections.abc import Iterator

import click
import pytest
from pyinfra.api import output
from pyinfra.api.config import Config
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import State
from pyinfra.api.util import log_error_or_warning, print_host_combined_output
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.operations import server

from kimi_pyinfra.failure_lines import JSON_MAX, FailureLines, failed_answer
from kimi_pyinfra.fleet_progress import install

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
REASON = "kimi-deploy: kimi-vllm: no answer within 600 s; journal tail:"
JOURNAL = ["    engine core: CUDA out of memory", "    kimi-vllm.service: Failed with result 'exit-code'."]
COMMCHECK = json.dumps(
    {"failures": [{"message": "kimi-h4 -> kimi-h3:29500 (dist_init): timed out"}], "host": "kimi-h1", "ok": False},
    sort_keys=True,
)


class Captured(logging.Handler):
    """The lines pyinfra's logger hands a handler that carries the filter, colours stripped."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(_ANSI.sub("", record.getMessage()))


@pytest.fixture
def captured() -> Iterator[Captured]:
    handler = Captured()
    handler.addFilter(FailureLines())
    pyinfra_logger = logging.getLogger("pyinfra")
    level = pyinfra_logger.level
    pyinfra_logger.addHandler(handler)
    pyinfra_logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        pyinfra_logger.removeHandler(handler)
        pyinfra_logger.setLevel(level)


@pytest.fixture(params=["plain", "coloured"])
def hosts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, Host]:
    """Hosts as pyinfra prints them: padded to the longest name, coloured as its CLI colours them."""
    if request.param == "coloured":
        monkeypatch.setattr(output, "_format_text", click.style)
    inventory = Inventory((["kimi-h1", "kimi-h12"], {}))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    return {name: inventory.get_host(name) for name in ("kimi-h1", "kimi-h12")}


def _failed(host: Host, *lines: tuple[str, str], description: str = "executed 0 commands") -> None:
    """What pyinfra logs for a failed command of ``host`` (pyinfra.api.operations.run_host_op)."""
    print_host_combined_output(host, CommandOutput([OutputLine(buffer, line) for buffer, line in lines]))
    log_error_or_warning(host, False, description)


@pytest.mark.parametrize("answer", [COMMCHECK, json.dumps({"ok": False, "error": "bad request: no unit"})])
def test_a_host_programs_failure_reads_as_its_reason_alone(
    hosts: dict[str, Host], captured: Captured, answer: str
) -> None:
    _failed(hosts["kimi-h1"], ("stdout", answer), ("stderr", REASON), *(("stderr", line) for line in JOURNAL))
    assert captured.lines == [f"[kimi-h1]  {REASON}", *(f"[kimi-h1]  {line}" for line in JOURNAL)]


def test_after_retries_too(hosts: dict[str, Host], captured: Captured) -> None:
    answer = ("stdout", json.dumps({"ok": False, "reason": "no answer"}))
    for _ in range(2):
        print_host_combined_output(
            hosts["kimi-h12"], CommandOutput([OutputLine(*answer), OutputLine("stderr", REASON)])
        )
    log_error_or_warning(hosts["kimi-h12"], False, "executed 0 commands (failed after 1/1 retries)")
    assert captured.lines == [f"[kimi-h12] {REASON}"] * 2


def test_a_failure_without_a_reason_keeps_pyinfras_error_line(hosts: dict[str, Host], captured: Captured) -> None:
    _failed(hosts["kimi-h1"], ("stderr", "E: Unable to locate package nvidia-driver-999"))
    assert captured.lines == [
        "[kimi-h1]  E: Unable to locate package nvidia-driver-999",
        "[kimi-h1]  Error: executed 0 commands",
    ]


def test_a_reason_counts_for_its_own_operation_only(hosts: dict[str, Host], captured: Captured) -> None:
    _failed(hosts["kimi-h1"], ("stderr", REASON))
    _failed(hosts["kimi-h1"], ("stderr", "E: dpkg was interrupted"), description="executed 2 commands")
    assert captured.lines == [
        f"[kimi-h1]  {REASON}",
        "[kimi-h1]  E: dpkg was interrupted",
        "[kimi-h1]  Error: executed 2 commands",
    ]


def test_another_hosts_error_line_stays(hosts: dict[str, Host], captured: Captured) -> None:
    print_host_combined_output(hosts["kimi-h1"], CommandOutput([OutputLine("stderr", REASON)]))
    _failed(hosts["kimi-h12"], ("stderr", "sh: 1: nvidia-smi: not found"))
    log_error_or_warning(hosts["kimi-h1"], False, "executed 0 commands")
    assert captured.lines == [
        f"[kimi-h1]  {REASON}",
        "[kimi-h12] sh: 1: nvidia-smi: not found",
        "[kimi-h12] Error: executed 0 commands",
    ]


def test_an_ignored_error_stays_and_ends_the_operation(hosts: dict[str, Host], captured: Captured) -> None:
    print_host_combined_output(hosts["kimi-h1"], CommandOutput([OutputLine("stderr", REASON)]))
    log_error_or_warning(hosts["kimi-h1"], True, "executed 0 commands")
    _failed(hosts["kimi-h1"], ("stderr", "E: dpkg was interrupted"))
    assert captured.lines == [
        f"[kimi-h1]  {REASON}",
        "[kimi-h1]  Error (ignored): executed 0 commands",
        "[kimi-h1]  E: dpkg was interrupted",
        "[kimi-h1]  Error: executed 0 commands",
    ]


@pytest.mark.parametrize(
    "line",
    [
        json.dumps({"ok": True, "path": "/opt/kimi/venv"}),
        json.dumps([{"ok": False}]),
        json.dumps({"error": "lock"}),
        json.dumps({"ok": 0}),
        json.dumps({"ok": None}),
        '{"ok": false',
        "Traceback (most recent call last):",
        "{}",
        '{"ok": false, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_any_other_output_line_stays(hosts: dict[str, Host], captured: Captured, line: str) -> None:
    _failed(hosts["kimi-h1"], ("stdout", line), ("stderr", REASON))
    assert captured.lines == [f"[kimi-h1]  {line}", f"[kimi-h1]  {REASON}"]


def test_an_answer_too_long_to_read_stays() -> None:
    long = json.dumps({"ok": False, "journal": "x" * JSON_MAX})
    assert not failed_answer(long)
    assert failed_answer(json.dumps({"ok": False, "journal": "x" * (JSON_MAX // 2)}))


def test_lines_not_of_a_host_stay(captured: Captured) -> None:
    logger = logging.getLogger("pyinfra")
    logger.error(json.dumps({"ok": False}))
    logger.error("Error: executed 0 commands")
    assert captured.lines == ['{"ok": false}', "Error: executed 0 commands"]


PROGRAM = """import json, sys
print(json.dumps({"ok": False, "error": "venv: the lock's pin of torch does not resolve"}))
print("kimi-deploy: venv: the lock's pin of torch does not resolve", file=sys.stderr)
sys.exit(1)
"""


@pytest.mark.parametrize(
    ("program", "shown"),
    [
        (PROGRAM, ["kimi-deploy: venv: the lock's pin of torch does not resolve"]),
        (
            "import sys; print('E: Unable to locate package', file=sys.stderr); sys.exit(100)",
            ["E: Unable to locate package", "Error: executed 0 commands"],
        ),
    ],
)
def test_through_a_pyinfra_run(captured: Captured, program: str, shown: list[str]) -> None:
    """A real operation on the local host: what pyinfra itself logs when the command fails."""
    state = State(Inventory((["@local"], {})), Config())  # type: ignore[no-untyped-call]
    connect_all(state)
    add_op(state, server.shell, f"{shlex.quote(sys.executable)} -c {shlex.quote(program)}")
    with pytest.raises(PyinfraError):  # the only host failed
        run_ops(state)
    assert [line.removeprefix("[@local] ") for line in captured.lines if line.startswith("[@local] ")] == [
        "Connected",
        *shown,
    ]


@pytest.mark.parametrize("verbose", [False, True])
def test_install_adds_the_filter_once_and_never_with_v(verbose: bool) -> None:
    handler = logging.NullHandler()
    logging.getLogger("pyinfra").addHandler(handler)
    try:
        state = State(Inventory((["kimi-h1"], {})), Config())  # type: ignore[no-untyped-call]
        state.print_noop_info = verbose
        install(state)
        install(state)
        assert sum(isinstance(f, FailureLines) for f in handler.filters) == (0 if verbose else 1)
    finally:
        logging.getLogger("pyinfra").removeHandler(handler)
