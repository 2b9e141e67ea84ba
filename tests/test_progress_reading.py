"""A host's progress file: what the host programs write, and the controller reads of it only that.

The file comes from a host, which may say anything: only one line of three ASCII integers, the
bytes done no more than those in all, reads as progress; anything else reads as none (never an
error, never slow).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from kimi_deploy.host.progress_reading import MOST_BYTES, Reading, parse_progress
from kimi_deploy.hostside.progress_file import (
    MAX_BYTES,
    progress_line,
    release_progress,
    remove_progress,
    write_progress,
)


def test_what_a_host_writes_reads_back(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    before = int(time.time())
    write_progress(path, 412_300_000_000, 1_560_000_000_000)
    text = Path(path).read_text(encoding="ascii")
    reading = parse_progress(text)
    assert reading is not None
    assert (reading.done, reading.total) == (412_300_000_000, 1_560_000_000_000)
    assert before <= reading.time <= time.time()
    assert len(text.encode()) <= MAX_BYTES
    # root's when a host program writes it, readable by whichever user the controller connects as
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["progress"]  # replaced whole: no temporary file stays


def test_a_host_never_writes_more_done_than_in_all_nor_less_than_nothing() -> None:
    assert progress_line(7, 5, 100.9) == "5 5 100\n"
    assert progress_line(-3, -1, 0) == "0 0 0\n"
    assert len(progress_line(10**19, 10**19, 10**11)) <= MAX_BYTES


def test_the_file_goes_when_the_program_ends_and_writing_where_it_cannot_fails_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "vllm-0.34.0")
    assert release_progress(path) == f"{path}.kimi-progress"
    write_progress(release_progress(path), 1, 2)
    Path(f"{release_progress(path)}.tmp").write_text("left by a kill")
    remove_progress(release_progress(path))
    assert os.listdir(tmp_path) == []
    remove_progress(release_progress(path))  # twice: nothing to remove
    write_progress(str(tmp_path / "no-such-folder" / "progress"), 1, 2)  # no folder: no file, no error


def test_a_link_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    path = tmp_path / "progress"
    os.symlink(target, f"{path}.tmp")
    write_progress(str(path), 1, 2)
    assert target.read_text() == "keep"


@pytest.mark.parametrize(
    ("text", "reading"),
    [
        ("412300000000 1560000000000 1767225600\n", Reading(412_300_000_000, 1_560_000_000_000, 1_767_225_600)),
        ("0 6233480 1767225600", Reading(0, 6_233_480, 1_767_225_600)),
        ("6233480 6233480 0\n", Reading(6_233_480, 6_233_480, 0)),
    ],
)
def test_a_progress_line_reads_as_its_numbers(text: str, reading: Reading) -> None:
    assert parse_progress(text) == reading


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        "5 4 1767225600",  # more done than in all
        "-1 4 1767225600",
        "1 -4 1767225600",
        "1 4",
        "1 4 1767225600 9",
        " 1 4 1767225600",
        "1  4 1767225600",
        "1\t4\t1767225600",
        "1 4 1767225600\n\n",
        "1 4 1767225600\r\n",
        "1 4 1767225600\nrm -rf /",
        "1.5 4 1767225600",
        "1e9 4e9 1767225600",
        "0x10 0x20 1767225600",
        "1_000 2_000 1767225600",
        "\u0661 \u0664 \u0661\u0667\u0666\u0667",  # digits, but not ASCII ones (Arabic-Indic)
        "\uff11 \uff14 1767225600",  # fullwidth
        "1 4 1767225600\x00",
        "\x1b[31m1 4 1767225600\x1b[0m",
        "nan inf 1767225600",
        f"1 {MOST_BYTES + 1} 1767225600",  # past an exabyte
        f"{'9' * 20} {'9' * 20} 1767225600",
        f"1 4 {'9' * 13}",
        "9" * 5000,  # past Python's int() digit limit, were it ever parsed
        "1 " * 50_000,
        "kimi-deploy: no such file",
    ],
)
def test_anything_else_a_host_says_reads_as_no_progress(text: str) -> None:
    assert parse_progress(text) is None


def test_a_long_hostile_answer_is_refused_at_once() -> None:
    text = "1" * 19 + " " + "1" * 19 + " " + "1" * 10_000_000
    started = time.perf_counter()
    assert parse_progress(text) is None
    assert time.perf_counter() - started < 0.01
