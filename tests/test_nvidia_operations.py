"""The shell the NVIDIA operations run to decide on a host, run here against apt's captured output.

``apt-get`` and ``apt-cache`` are stand-ins on ``PATH`` that print what the real ones printed on a
test host (``tests/fixtures/apt``) and exit as they did; the snippets run with ``sh``, as on hosts.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kimi_pyinfra.operations.nvidia import apt_install, candidate_is

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "apt"
LINE = "kimi-h1: drivers: a reboot is needed to load driver {version} (580.95.05 is loaded); allow it"


def _run(tmp_path: Path, command: str, tool: str, fixture: str, status: int) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / tool
    fake.write_text(f"#!/bin/sh\ncat {FIXTURES / fixture}\nexit {status}\n", encoding="utf-8")
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, check=False)


def test_apts_refusal_is_one_line_naming_the_unmet_dependency(tmp_path: Path) -> None:
    done = _run(tmp_path, apt_install(["nvidia-imex=580.95.05-1"]), "apt-get", "install-refused-depends.txt", 100)
    assert done.returncode == 100
    assert done.stdout == (FIXTURES / "install-refused-depends.txt").read_text(encoding="utf-8")
    assert done.stderr == (
        "kimi-deploy: drivers: apt-get install refused: nvidia-imex : Depends: nvidia-kernel-common "
        "(= 580.95.05-1) but 580.105.08-1 is to be installed\n"
    )


def test_an_install_apt_accepts_says_nothing_more(tmp_path: Path) -> None:
    done = _run(tmp_path, apt_install(["nvidia-imex"]), "apt-get", "policy-nvidia-driver-cuda.txt", 0)
    assert (done.returncode, done.stderr) == (0, "")


def test_the_candidate_check_stops_before_an_install_that_needs_a_reboot(tmp_path: Path) -> None:
    other = _run(
        tmp_path, candidate_is("nvidia-driver-cuda", "580.95.05", LINE), "apt-cache", "policy-nvidia-driver-cuda.txt", 0
    )
    assert other.returncode == 1
    assert other.stderr == (
        "kimi-deploy: kimi-h1: drivers: a reboot is needed to load driver 580.105.08 (580.95.05 is loaded); allow it\n"
    )


def test_the_candidate_check_passes_the_loaded_release(tmp_path: Path) -> None:
    same = _run(
        tmp_path,
        candidate_is("nvidia-driver-cuda", "580.105.08", LINE),
        "apt-cache",
        "policy-nvidia-driver-cuda.txt",
        0,
    )
    assert (same.returncode, same.stderr) == (0, "")
