"""The weights scrub timer: systemd accepts it, it runs at idle priority, and what it runs is a sync."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.host.command import bundle
from kimi_deploy.hostside.requests import SyncRequest
from kimi_deploy.recipe import Scrub
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.render.scrub_units import scrub_files

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

REQUEST: SyncRequest = {
    "repo": "moonshotai/Kimi-K3.1-Pro",
    "revision": "a" * 40,
    "dir": "/srv/models/moonshotai--Kimi-K3.1-Pro/" + "a" * 40,
    "lock": {"config.json": [10, "gitblob:" + "0" * 40]},
    "endpoint": None,
    "token_file": "/etc/kimi/secrets/hf-token",
    "retries": 2,
    "progress_log": "/var/log/kimi/weights.log",
}
ROOT = Path(__file__).resolve().parents[1]


def files(scrub: Scrub) -> dict[str, str]:
    out = scrub_files(
        scrub,
        config_dir="/etc/kimi",
        tools_dir="/opt/kimi/tools",
        python="/opt/kimi/tools/hh/bin/python",
        request=REQUEST,
    )
    return {f.path: f.content for f in out}


def test_the_scrub_runs_the_sync_program_in_scrub_mode_at_idle_priority() -> None:
    rendered = files(Scrub(schedule="Sun *-*-* 03:00:00", repair=False))
    service = rendered["/etc/systemd/system/kimi-weights-scrub.service"]
    assert "IOSchedulingClass=idle" in service
    assert "Nice=19" in service
    assert "CPUSchedulingPolicy=idle" in service
    assert (
        "ExecStart=/opt/kimi/tools/hh/bin/python /opt/kimi/tools/kimi-weights-sync.py "
        "--config /etc/kimi/kimi-weights-scrub.json" in service
    )
    assert f"ReadWritePaths={REQUEST['dir']}" in service
    config = json.loads(rendered["/etc/kimi/kimi-weights-scrub.json"])
    assert config == {**REQUEST, "scrub": True, "repair": False, "full": True, "peers": []}
    assert rendered["/opt/kimi/tools/kimi-weights-sync.py"] == bundle("weights_sync.py")
    assert "OnCalendar=Sun *-*-* 03:00:00" in rendered["/etc/systemd/system/kimi-weights-scrub.timer"]


def test_a_schedule_that_could_break_the_unit_file_is_refused_in_one_line(tmp_path: Path) -> None:
    text = (ROOT / "recipes/demo-gpu.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("schedule: weekly", 'schedule: "weekly\\nExecStartPre=/bin/sh"'), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_recipe(bad)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(f"{bad}: weights.scrub.schedule:")


systemd_analyze = shutil.which("systemd-analyze")


@pytest.mark.skipif(systemd_analyze is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_scrub_units_and_rates_the_service_ok(tmp_path: Path) -> None:
    assert systemd_analyze is not None
    for path, content in files(Scrub()).items():
        if not path.endswith((".service", ".timer")):
            continue
        unit = tmp_path / Path(path).name
        unit.write_text(content, encoding="utf-8")
        verify = subprocess.run(
            [systemd_analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
        )
        problems = [
            line
            for line in (verify.stdout + verify.stderr).splitlines()
            if line.strip() and "is not executable" not in line and "No such file" not in line
        ]
        assert problems == [], path
    security = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", "--no-pager", str(tmp_path / "kimi-weights-scrub.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    score = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", security.stdout)
    assert score is not None, security.stdout[-500:]
    assert float(score.group(1)) <= 4.0
