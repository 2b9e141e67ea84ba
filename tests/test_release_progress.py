"""A release install's progress file, from the host program as hosts run it (bundled), with a
stand-in ``uv`` that says what the real one says as it fetches (fixtures/uv) and notes what the
progress file holds each time it has said something.

While uv fetches, ``<release>.kimi-progress`` holds the bytes of the wheels uv named: in all as
each starts, done as each ends; the file goes when the install ends, installed or failed.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.bundled import bundled_program
from tests.test_venv_install_lock import ENGINE_LOCK, REQS, SITE, _dist, _platform_lock

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

MiB = 1 << 20
# The stand-in uv: ``venv`` makes the folder; ``pip sync`` says the lines of said.txt on stderr,
# one at a time, each time noting the release's progress file (after a download's line, once it
# changed: up to 5 s), then installs installed.json's files, or fails.
FAKE_UV = f"""\
import json, os, sys, time
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.argv[1] == "venv":
    os.makedirs(os.path.join(sys.argv[-1], "bin"))
    os.makedirs(os.path.join(sys.argv[-1], "{SITE}"))
elif sys.argv[1:3] == ["pip", "sync"]:
    venv = os.path.dirname(os.path.dirname(sys.argv[sys.argv.index("--python") + 1]))
    progress = venv[: -len(".kimi-new")] + ".kimi-progress"
    def held():
        try:
            with open(progress) as f:
                return f.read()
        except OSError:
            return None
    seen = []
    with open(os.path.join(here, "said.txt")) as said:
        for line in said:
            before = held()
            sys.stderr.write(line)
            sys.stderr.flush()
            until = time.monotonic() + (5 if "Download" in line else 0)
            while held() == before and time.monotonic() < until:
                time.sleep(0.01)
            seen.append(held())
    with open(os.path.join(here, "seen.json"), "w") as out:
        json.dump(seen, out)
    if os.path.exists(os.path.join(here, "fail")):
        sys.stderr.write("error: Failed to download `scipy==1.15.1`\\n")
        sys.exit(2)
    with open(os.path.join(here, "installed.json")) as listed:
        for name, text in json.load(listed).items():
            os.makedirs(os.path.dirname(os.path.join(venv, "{SITE}", name)), exist_ok=True)
            with open(os.path.join(venv, "{SITE}", name), "w") as out:
                out.write(text)
"""
SAID = (Path(__file__).resolve().parent / "fixtures" / "uv" / "pip_sync_numpy-2.2.2_scipy-1.15.1.txt").read_text()


class Host:
    def __init__(self, tmp_path: Path) -> None:
        self.uv = tmp_path / "uv-0.13.9"
        (self.uv / "bin").mkdir(parents=True)
        (self.uv / "bin/uv").write_text(f"#!{sys.executable}\n{FAKE_UV}", encoding="utf-8")
        (self.uv / "bin/uv").chmod(0o755)
        (self.uv / ".kimi-release.json").write_text('{"package": "uv"}', encoding="utf-8")
        (self.uv / "said.txt").write_text(SAID, encoding="utf-8")
        files = {**_dist("fastsafetensors", "0.5.0"), **_dist("vLLM", "0.34.0")}
        (self.uv / "installed.json").write_text(json.dumps(files), encoding="utf-8")
        self.path = tmp_path / "engines/vllm-0.34.0+fastsafetensors-0.5.0"
        self.program = bundled_program("venv_install.py", tmp_path)

    def install(self) -> tuple[int, dict[str, Any]]:
        request = {
            "path": str(self.path),
            "requirements": REQS,
            "index_url": "http://127.0.0.1:9/simple",
            "marker": {"package": "vllm", "version": "0.34.0", "requirements": REQS},
            "uv": {"version": "0.13.9", "dir": str(self.uv)},
            "lock": {"text": _platform_lock(ENGINE_LOCK)},
        }
        packed = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
        done = subprocess.run(
            [sys.executable, str(self.program), packed], capture_output=True, text=True, check=False, timeout=60
        )
        return done.returncode, json.loads(done.stdout.splitlines()[-1])

    def seen(self) -> list[tuple[int, int] | None]:
        """(done, total) in the progress file after each line uv said."""
        held = json.loads((self.uv / "seen.json").read_text())
        return [None if text is None else (int(text.split()[0]), int(text.split()[1])) for text in held]


def _expected() -> list[tuple[int, int] | None]:
    numpy, scipy = int(15.6 * MiB), int(38.7 * MiB)
    both = numpy + scipy
    # Using..., Resolved...: no file yet; then each wheel as it starts and ends; the rest as it was
    return [None, None, (0, numpy), (0, both), (numpy, both), (both, both), *[(both, both)] * 4]


def test_the_file_counts_the_wheels_uv_names_and_goes_once_installed(tmp_path: Path) -> None:
    host = Host(tmp_path)
    code, answer = host.install()
    assert (code, answer["ok"]) == (0, True), answer
    assert host.seen() == _expected()
    assert not Path(f"{host.path}.kimi-progress").exists()
    assert sorted(p.name for p in host.path.parent.iterdir()) == [host.path.name]


def test_the_file_goes_when_the_install_fails(tmp_path: Path) -> None:
    host = Host(tmp_path)
    (host.uv / "fail").touch()
    code, answer = host.install()
    assert (code, answer["ok"]) == (1, False)
    assert host.seen() == _expected()
    assert not Path(f"{host.path}.kimi-progress").exists()
    assert not host.path.parent.exists() or sorted(p.name for p in host.path.parent.iterdir()) == []
