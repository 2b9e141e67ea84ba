"""deploys/report.py on the demo cluster: a table and the same as JSON, and no change anywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.own_cluster import BIN, ROOT
from tests.e2e.demo import GPU_RECIPE

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)


@pytest.fixture(autouse=True, scope="module")
def _cluster(demo_cluster: None) -> None:
    """Needs the demo cluster's Hub and hosts."""


def test_report_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    run = subprocess.run(
        [
            str(BIN / "pyinfra"),
            "inventories/demo.py",
            "deploys/report.py",
            "-y",
            "--data",
            f"kimi_report_json={target}",
            "--data",
            f"kimi_recipe={GPU_RECIPE}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-3000:]
    report = json.loads(target.read_text(encoding="utf-8"))
    assert list(report) == ["kimi-h1", "kimi-h2", "kimi-h3", "kimi-h4"]
    for host, profile in report.items():
        acc = profile["accelerators"]
        assert (acc["vendor"], acc["count"], acc["model"]) == ("nvidia", 8, "NVIDIA B300 SXM6 AC"), host
        assert acc["topology"]["matrix"]["GPU0"]["GPU1"] == "NV18"
        assert profile["disk"]["free_bytes"] > 0
        assert profile["disk"]["read_mb_s"] > 0
        assert profile["os"]["id"] == "debian"
    rows = [line.strip() for line in log.splitlines() if line.strip().startswith("kimi-h") and " x NVIDIA " in line]
    assert [r.split()[0] for r in rows] == ["kimi-h1", "kimi-h2", "kimi-h3", "kimi-h4"]
    assert "8 x NVIDIA B300 SXM6 AC 268 GiB" in rows[0]
    assert "Beginning operation run" in log
    assert "Starting operation" not in log
