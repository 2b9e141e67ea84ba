"""What a host reports (its GPU names, driver strings, device names, error texts) reaches the
operator's terminal with every control character escaped: a host, or whoever set a name on it,
cannot clear the screen, retitle the terminal or hide a line behind an escape sequence."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from kimi_deploy.host.preflight import Needs, check
from kimi_deploy.host.report_table import format_report
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_pyinfra.cli import main
from kimi_pyinfra.operations import preflight
from tests.conftest import PROD, RECIPE
from tests.profiles import profile_of

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

# nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv as a host printed it, where a
# GPU's name (set by whoever controls the host's driver or its nvidia-smi) carries a screen clear,
# a window title and a colour.
HOSTILE_NAME = "NVIDIA H100 80GB HBM3\x1b[2J\x1b]0;pwned\x07\x1b[31m"
CAPTURE = "name, memory.total [MiB], driver_version\n" + "".join(
    f"{HOSTILE_NAME}, 81559 MiB, 550.54.15\n" for _ in range(8)
)
# What a terminal acts on rather than shows; a line's own end is the only one allowed.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def test_printable_escapes_every_control_character_and_keeps_the_rest() -> None:
    said = printable("GPU \x1b[31mred\x9b2J\x7f\x00\ttab\nline\u202eevil\u00e9")
    assert RAW_CONTROL.search(said) is None
    assert "\n" not in said
    assert said == "GPU \\x1b[31mred\\x9b2J\\x7f\\x00\\ttab\\nline\\u202eevil\u00e9"


def test_facts_check_refusal_shows_a_hostile_gpu_name_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "nvidia-smi.csv"
    capture.write_text(CAPTURE, encoding="utf-8")
    code = main(["facts", "check", RECIPE, PROD, "b300-01", "--nvidia-smi-query", str(capture)])
    out, err = capsys.readouterr()
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith("kimi-deploy: b300-01: accelerators: pool serve needs 8 x B300")
    assert "found 8 x NVIDIA H100 80GB HBM3\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31m (79 GiB)" in line
    assert RAW_CONTROL.search(out + err) is None


def test_facts_check_pass_shows_a_hostile_gpu_name_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = tmp_path / "nvidia-smi.csv"
    name = "NVIDIA B300 SXM6 AC\x1b]0;pwned\x07"
    capture.write_text(
        "name, memory.total [MiB], driver_version\n" + f"{name}, 275040 MiB, 580.95.05\n" * 8, encoding="utf-8"
    )
    code = main(["facts", "check", RECIPE, PROD, "b300-01", "--nvidia-smi-query", str(capture)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "found 8 x NVIDIA B300 SXM6 AC\\x1b]0;pwned\\x07 (268 GiB)" in out
    assert RAW_CONTROL.search(out + err) is None


def test_a_preflight_refusal_prints_a_hostile_gpu_name_and_driver_error_escaped(
    recipe: Recipe, prod: Inventory
) -> None:
    spec = plan(recipe, RECIPE, prod).for_host("b300-01")
    needs = Needs(recipe, spec, 1_560_000_000_000, 0, [])
    profile = profile_of(
        accelerators={"vendor": "nvidia", "count": 8, "model": HOSTILE_NAME, "memory_mib": 81559},
        disk={"path": "/srv/models", "fs_type": "xfs\x1b[8m", "free_bytes": 30 * 10**12, "total_bytes": 30 * 10**12},
        memory={"total_bytes": 2048 * 2**30},
    )
    broken = copy.deepcopy(profile)
    broken["accelerators"].update({"count": 0, "model": None, "error": "Failed to initialize NVML\x1b[1A\x1b[2K"})
    for found in (profile, broken):
        failures = check(needs, found)
        assert failures
        # The host prints the refusal (operations/preflight.py): run its command as the host would.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(preflight, "host", SimpleNamespace(noop=lambda _: None))
            (command,) = list(preflight.passed._inner(failures=failures))
        shown = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=10, check=False)
        assert shown.returncode == 1
        assert shown.stderr.startswith("kimi-deploy: preflight: b300-01: accelerators: ")
        assert RAW_CONTROL.search(shown.stderr) is None
    assert "\\x1b[1A\\x1b[2K" in "".join(check(needs, broken))


def test_the_topology_report_shows_hostile_host_strings_escaped() -> None:
    profile = profile_of(
        accelerators={
            "vendor": "nvidia",
            "count": 8,
            "model": HOSTILE_NAME,
            "memory_mib": 81559,
            "driver_version": "550.54.15\x1b[8m",
        },
        os={"pretty": "Ubuntu\x1b]0;pwned\x07 24.04"},
        disk={"free_bytes": 10**12, "fs_type": "xfs"},
    )
    table = format_report({"gpu-07": profile})
    assert RAW_CONTROL.search(table) is None
    assert "8 x NVIDIA H100 80GB HBM3\\x1b[2J" in table
