"""What goes wrong outside the recipe (a Hub that cannot be reached, a folder that cannot be
written, an interrupt) is one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "recipes").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "demo.yaml", site / "recipes" / "demo.yaml")
    return site


def _kimi(cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kimi_pyinfra.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_lock_with_the_hub_unreachable_is_one_line_naming_it(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    run = _kimi(_site(tmp_path), "lock", "recipes/demo.yaml", "--endpoint", endpoint)
    out, err = run.communicate(timeout=180)  # the Hub client's own retries first
    assert run.returncode == 2, err
    assert err == f"recipes/demo.yaml: model: {endpoint} unreachable: [Errno 111] Connection refused\n"
    assert out == ""


def test_an_interrupted_lock_says_so_in_one_line(tmp_path: Path) -> None:
    run = _kimi(_site(tmp_path), "lock", "recipes/demo.yaml", "--endpoint", f"http://127.0.0.1:{_closed_port()}")
    time.sleep(3)  # in the Hub client's retries
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert (run.returncode, err) == (130, "kimi-deploy lock: interrupted\n")


@pytest.mark.parametrize("where", ["/proc/kimi-site", "a-file/site"])
def test_init_into_a_folder_it_cannot_make_is_one_line(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    run = _kimi(tmp_path, "init", where)
    _, err = run.communicate(timeout=60)
    assert run.returncode != 0
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert err.startswith(f"kimi-deploy init: {where.split('/', maxsplit=1)[0] or where}")
