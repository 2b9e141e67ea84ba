"""SIGINT and SIGTERM on a converge (kimi_pyinfra.stop_signals), on a real pyinfra run on ``@local``.

Each case writes a deploy file of three steps (``server.shell``) and runs ``pyinfra @local
deploy.py -y`` as a user does; the first step writes file A, sleeps, then writes file B, so a
signal sent once A exists lands while the step is under way. The later steps write C and D.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
SLEEP_S = 4  # the first step's sleep between A and B
FIRST = "Services: stores"  # a step that (re)starts units, as operations/start_order.py names them
NOT_TESTED = (
    f"what {FIRST!r} (re)started is not smoke-tested yet: the next converge waits for it before restarting "
    "anything else"
)


def deploy_text(folder: Path, names: tuple[str, str, str], *, sleep_while_loading: bool = False) -> str:
    a, b, c, d = (folder / f for f in "ABCD")
    loading = f"Path({str(a)!r}).touch()\ntime.sleep({SLEEP_S})\nPath({str(b)!r}).touch()\n"
    return (
        "import time\n"
        "from pathlib import Path\n"
        "from pyinfra.context import state\n"
        "from pyinfra.operations import server\n"
        "from kimi_pyinfra.stop_signals import StopOnSignal, install\n"
        "install(state)\n"
        "install(state)  # once per state, however often the deploy file loads\n"
        "assert sum(isinstance(h, StopOnSignal) for h in state.callback_handlers) == 1\n"
        + (loading if sleep_while_loading else "")
        + f"server.shell(name={names[0]!r}, commands=['touch {a}; sleep {SLEEP_S}; touch {b}'])\n"
        f"server.shell(name={names[1]!r}, commands=['touch {c}'])\n"
        f"server.shell(name={names[2]!r}, commands=['touch {d}'])\n"
    )


@dataclass
class Stopped:
    code: int
    out: str
    exit_s: float  # from the last signal to the process's end
    files: set[str]  # which of A, B, C, D exist when it ended


def _wait_for(what: str, proc: subprocess.Popen[bytes], out: Path, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 90
    while not done():
        if proc.poll() is not None:
            pytest.fail(f"pyinfra ended ({proc.returncode}) before {what}:\n{out.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after 90 s:\n{out.read_text()}")
        time.sleep(0.02)


def converge(tmp_path: Path, deploy: str, signals: list[signal.Signals]) -> Stopped:
    """Run the deploy; once A exists send ``signals`` to pyinfra (each after the line the one
    before it got); return how the run ended."""
    (tmp_path / "deploy.py").write_text(deploy, encoding="utf-8")
    out = tmp_path / "out.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [PYINFRA, "@local", str(tmp_path / "deploy.py"), "-y"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the commands it leaves go with it below
        )
    try:
        _wait_for("file A", proc, out, (tmp_path / "A").exists)
        for i, signum in enumerate(signals):
            os.kill(proc.pid, signum)
            if i + 1 < len(signals):
                _wait_for("the stop's first line", proc, out, lambda: "kimi-deploy:" in out.read_text())
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        exit_s = time.monotonic() - sent
        files = {f for f in "ABCD" if (tmp_path / f).exists()}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a command a stop cut short (the sleep of step one)
    return Stopped(code, out.read_text(), exit_s, files)


def lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if "kimi-deploy:" in line]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_lets_the_step_under_way_end_then_stops(tmp_path: Path, signum: signal.Signals, code: int) -> None:
    run = converge(tmp_path, deploy_text(tmp_path, (FIRST, "Smoke test", "Router")), [signum])
    name = signum.name
    assert run.code == code, run.out
    assert run.files == {"A", "B"}, run.out  # the step under way ended; no later step started
    assert lines(run.out) == [
        f"kimi-deploy: {name}: stopping once the step under way ends on every host ({name} again stops now)",
        f"kimi-deploy: {name}: stopped after step {FIRST!r} (1 of 3); the 2 later steps did not run",
        f"kimi-deploy: [@local] changed by: {FIRST}; {NOT_TESTED}",
    ]
    # Neither of pyinfra's own handlers answered (its message, gevent.kill's traceback).
    assert "Exiting upon user request" not in run.out
    assert "Traceback" not in run.out


def test_a_smoke_test_that_passed_after_the_services_step_leaves_nothing_to_wait_for(tmp_path: Path) -> None:
    deploy = deploy_text(tmp_path, ("Smoke test", "Router", "Watchdog")).replace(
        "install(state)\n", f"install(state)\nserver.shell(name={FIRST!r}, commands=['true'])\n", 1
    )
    run = converge(tmp_path, deploy, [signal.SIGINT])
    assert run.code == 130, run.out
    assert run.files == {"A", "B"}, run.out
    assert lines(run.out)[1:] == [
        "kimi-deploy: SIGINT: stopped after step 'Smoke test' (2 of 4); the 2 later steps did not run",
        f"kimi-deploy: [@local] changed by: {FIRST}, Smoke test",
    ]


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    run = converge(tmp_path, deploy_text(tmp_path, ("One", "Two", "Three")), [signal.SIGINT, signal.SIGINT])
    assert run.code == 130, run.out
    assert run.exit_s < 2.0, run.out  # the step under way had seconds of its sleep left
    assert run.files == {"A"}, run.out
    assert lines(run.out) == [
        "kimi-deploy: SIGINT: stopping once the step under way ends on every host (SIGINT again stops now)",
        "kimi-deploy: SIGINT again: stopping now; step 'One' is cut short where it had not ended "
        "(what it did there is unknown)",
        "kimi-deploy: [@local] no step changed it in this run; step 'One' was cut short here",
    ]
    assert "Traceback" not in run.out


def test_a_signal_while_the_deploy_file_loads_stops_at_once(tmp_path: Path) -> None:
    deploy = deploy_text(tmp_path, ("One", "Two", "Three"), sleep_while_loading=True)
    run = converge(tmp_path, deploy, [signal.SIGTERM])
    assert run.code == 143, run.out
    assert run.exit_s < 2.0, run.out
    assert run.files == {"A"}, run.out  # the load stopped in its sleep; no step ran
    assert lines(run.out) == ["kimi-deploy: SIGTERM: stopping now, before any step ran"]
    assert "Traceback" not in run.out
