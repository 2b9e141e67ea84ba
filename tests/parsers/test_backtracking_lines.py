"""Lines built to make the parsers' patterns backtrack (kimi_deploy/parsers/): nccl-tests output
with 20,000-digit numbers, a topology's NIC legend of 40,000 colons. A host's output is read on the
controller, so each must get its verdict (what the output says, or one ``ParseError`` line) in
well under a second, not the tens of seconds a pattern that tries every split of a run takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kimi_deploy.parsers.nvidia_smi_topo import parse_topo
from tests.cli_run import kimi
from tests.conftest import ROOT
from tests.parsers import FIXTURES

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

DIGITS = "1" * 20_000
GOOD = "nccl_allreduce_rtx5090x4_single_good_nccltests287.txt"

# (the run's last lines replaced by, what the parse answers: the run's average or the error's end)
CASES = {
    # not a number the summary holds: the line is someone else's, the run has no average
    "average-digits-then-a-letter": (f"# Avg bus bandwidth    : {DIGITS}x\n", "average None"),
    "average-digits-then-a-word": (f"# Avg bus bandwidth    : {DIGITS} NOTOK\n", "average None"),
    "average-digits-dot-digits-then-a-letter": (f"# Avg bus bandwidth    : {DIGITS}.{DIGITS}x\n", "average None"),
    "average-past-a-float": (f"# Avg bus bandwidth    : {DIGITS}\n", "error is not a finite number"),
    "average-long-but-finite": (f"# Avg bus bandwidth    : 0.{DIGITS} OK\n", "average 0.1111111111111111"),
    "row-digits-then-a-letter": (
        f"8 2 float sum -1 {DIGITS}x 0.00 0.00 0 1.0 0.00 0.00 0\n",
        "error is not a number",
    ),
    "row-digits-dot-digits-then-a-letter": (
        f"8 2 float sum -1 {DIGITS}.{DIGITS}e 0.00 0.00 0 1.0 0.00 0.00 0\n",
        "error is not a number",
    ),
}


def _in_time(program: str, stdin: str) -> str:
    """What ``program`` (Python, run from the repository root) prints for ``stdin``, within 5 s."""
    run = subprocess.run(
        [sys.executable, "-c", program], input=stdin, cwd=ROOT, capture_output=True, text=True, timeout=5, check=False
    )
    assert (run.returncode, run.stderr) == (0, "")
    return run.stdout.strip()


@pytest.mark.parametrize(("tail", "expected"), list(CASES.values()), ids=list(CASES))
def test_a_20000_digit_number_gets_its_verdict_in_time(tail: str, expected: str) -> None:
    program = textwrap.dedent(f"""
        import sys
        from kimi_deploy.parsers import ParseError
        from kimi_deploy.parsers.nccl_tests import parse_nccl_tests
        text = open({str(FIXTURES / GOOD)!r}, encoding="utf-8").read()
        text = text[: text.index("# Avg bus bandwidth")] + sys.stdin.read()
        try:
            print("average", parse_nccl_tests(text)["avg_busbw_gbs"])
        except ParseError as exc:
            message = str(exc)
            assert message.splitlines() == [message] and len(message) <= 420, message
            print("error", message.split("' ")[-1])
    """)
    assert _in_time(program, tail) == expected


def test_facts_parse_answers_20000_digit_averages_in_time(tmp_path: Path) -> None:
    text = (FIXTURES / GOOD).read_text(encoding="utf-8")
    hostile = tmp_path / "nccl.txt"
    hostile.write_text(text[: text.index("# Avg bus bandwidth")] + f"# Avg bus bandwidth : {DIGITS}x\n" * 3)
    run = kimi("facts", "parse", "--kind", "nccl-all-reduce", str(hostile))
    assert (run.returncode, run.stderr) == (0, "")
    assert json.loads(run.stdout)["avg_busbw_gbs"] is None


TOPO = "topo_a100x8_10nic_tabs_niclegend_oyanghd.txt"
COLONS = "x:" * 40_000

# (a NIC legend line, the legend it makes: the entries of the capture, this one's last)
LEGEND = {
    "colons-then-two-words": (f"  {COLONS} a b", None),
    "colons-then-colon-and-two-words": (f"  {COLONS} : a b", None),
    "colons-then-a-word": (f"  {COLONS} a", (COLONS[:-1], "a")),
    "colons-one-word": (f"  NIC0:{COLONS}", ("NIC0:" + COLONS[:-3], "x:")),
    "name-space-colon-device": ("  NIC0 : mlx5_9", ("NIC0", "mlx5_9")),
    "name-colon-space-device": ("  NIC0: mlx5_9", ("NIC0", "mlx5_9")),
    "name-space-colondevice": ("  NIC0 :mlx5_9", ("NIC0", "mlx5_9")),
    "name-colondevice": ("  NIC0:mlx5_9", ("NIC0", "mlx5_9")),
    "name-colon-colon": ("  NIC0: :", ("NIC0", ":")),
    "colon-alone": ("  :", None),
    "no-colon": ("  NIC0 mlx5_9", None),
}


@pytest.mark.parametrize(("line", "entry"), list(LEGEND.values()), ids=list(LEGEND))
def test_a_nic_legend_line_is_read_in_time(line: str, entry: tuple[str, str] | None) -> None:
    program = textwrap.dedent("""
        import sys
        from kimi_deploy.parsers.nvidia_smi_topo import _legends
        print(_legends(["NIC Legend:", sys.stdin.read()])[1])
    """)
    assert _in_time(program, line) == str(dict([entry] if entry else []))


def test_a_topology_with_a_hostile_legend_line_reads_as_before() -> None:
    text = (FIXTURES / TOPO).read_text(encoding="utf-8") + f"  {COLONS} a b\n"
    assert parse_topo(text) == parse_topo((FIXTURES / TOPO).read_text(encoding="utf-8"))
