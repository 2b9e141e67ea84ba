"""The watchdog's reading of GPU faults from the kernel's log: NVIDIA's Xid lines in real kernel
logs (tests/fixtures/xid, each cited in its SOURCES.md), the kernel's ``/dev/kmsg`` record format
(read on this machine's own kernel where it lets us), and the watchdog draining an engine that
was running when a GPU fault was logged, and not one started after it."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside import watchdog
from kimi_deploy.hostside.kmsg import KERNEL, Kmsg, parse
from kimi_deploy.hostside.xid import APPLICATION_XIDS, Xid, bus_of
from kimi_deploy.hostside.xid import parse as parse_xid

FIXTURES = Path(__file__).parent / "fixtures" / "xid"

# (code, GPU) -> events, as read off each capture by hand
EXPECTED: dict[str, dict[tuple[int, str], int]] = {
    "xid_01_ml-engineering_xid63.txt": {(63, "0000:10:1c"): 1},
    "xid_02_nvidia-gpu-operator-docs_xid79.txt": {(79, "0000:ca:00"): 1},
    "xid_03_gpud-testdata_dmesg-with-xid-119.log.txt": {(119, "0000:9b:00"): 5},
    "xid_04_gpud-testdata_dmesg0_xid48-63-94.txt": {
        (48, "0000:19:00"): 1,
        (63, "0000:19:00"): 1,
        (94, "0000:19:00"): 9,
    },
    "xid_05_gpud-testdata_dmesg-iso_xid13-43.txt": {(13, "0000:38:00"): 629, (43, "0000:38:00"): 7},
    "issue_07_NVIDIA-NVSentinel-155_fallen-off-bus-multiline_570.158.01.txt": {(79, "0000:44:00"): 1},
    "issue_08_NVIDIA-gpu-operator-1146_xid48_TRUNCATED.txt": {(48, "0000:07:00"): 1},
    "issue_09_leptonai-gpud-pr46_xid13-109_dmesg-ctime.txt": {(13, "0000:cb:00"): 3, (109, "0000:cb:00"): 1},
    "issue_10_leptonai-gpud-pr1174-pr1160_xid94-144-145-149.txt": {
        (149, "0019:01:00"): 1,
        (149, "0000:00:00"): 3,
        (145, "0018:01:00"): 1,
        (94, "0000:9b:00"): 1,
        (144, "0000:01:00"): 1,
    },
    "issue_11_NVIDIA-open-gpu-kernel-modules-1150_xid45-after-145-149_590.48.01.txt": {
        (45, "0000:dc:00"): 2,
        (45, "0000:ed:00"): 2,
        (45, "0000:ba:00"): 2,
        (45, "0000:97:00"): 1,
    },
    "issue_12_Bumblebee-677_xid32-31_old-format.txt": {(32, "0000:01:00"): 2, (31, "0000:01:00"): 1},
    "issue_13_Bumblebee-554_fallen-off-bus_old-format.txt": {(79, "0000:01:00"): 2},
    "pastebin_01_jJdbRLSr_xid79_375.26.txt": {(79, "0000:03:00"): 1},
    "pastebin_02_xJaypMZt_fallen-off-bus_xid3-oldformat.txt": {(79, "0000:01:00"): 1, (3, "0000:01:00"): 1},
}


def test_every_capture_is_cited_and_read_as_by_hand() -> None:
    sources = (FIXTURES / "SOURCES.md").read_text(encoding="utf-8")
    captures = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert captures == sorted(EXPECTED)
    for name in captures:
        assert name.split("_", 3)[0] + "_" + name.split("_", 3)[1] in sources, name
        text = (FIXTURES / name).read_text(encoding="utf-8", errors="replace")
        found = Counter((x.code, x.bus) for line in text.splitlines() if (x := parse_xid(line)) is not None)
        assert dict(found) == EXPECTED[name], name


def test_a_message_over_several_lines_is_one_record_and_read_whole() -> None:
    """The open driver's "fallen off the bus" without an Xid spans three lines of dmesg; the
    kernel keeps it as one record (``/dev/kmsg`` escapes the newlines as \\x0a)."""
    lines = (
        (FIXTURES / "issue_07_NVIDIA-NVSentinel-155_fallen-off-bus-multiline_570.158.01.txt").read_text().splitlines()
    )
    body = [line.split("NVRM: ", 1)[1] for line in lines[1:4]]
    record = parse(("3,812,1843308145,-;NVRM: " + "\\x0aNVRM: ".join(body)).encode())
    assert record is not None
    assert record.facility == KERNEL
    assert parse_xid(record.message) == Xid(79, "0000:b3:00", "GPU has fallen off the bus.")


def test_the_details_are_kept_without_the_process_and_other_kernel_lines_are_none() -> None:
    line = "NVRM: Xid (PCI:0000:ca:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert parse_xid(line) == Xid(79, "0000:ca:00", "GPU has fallen off the bus.")
    assert parse_xid("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01") is None
    assert parse_xid("usbhid 2-3:1.0: suspend error -5") is None


def test_nvidia_smi_s_bus_id_names_the_gpu_as_an_xid_does() -> None:
    assert bus_of("00000000:3B:00.0") == "0000:3b:00"
    assert bus_of("00000019:01:00.0") == "0019:01:00"


def test_kmsg_records_and_their_continuation_lines() -> None:
    """The format of Documentation/ABI/testing/dev-kmsg: prio (facility << 3 | level), seq, µs."""
    record = parse(b"4,1024,5107644336,-;NVRM: Xid (PCI:0000:03:00): 79, GPU has fallen off the bus.")
    assert record is not None
    assert (record.facility, record.level, record.seq, record.usec) == (0, 4, 1024, 5107644336)
    assert parse(b" SUBSYSTEM=pci") is None
    assert parse(b"12,7,100,-;from root, not the kernel").facility == 1  # type: ignore[union-attr]
    assert parse(b"no record") is None


def test_the_reader_goes_on_from_where_it_was_and_keeps_half_a_line(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_bytes(b"6,1,10,-;first\n SUBSYSTEM=x\n6,2,20,-;sec")
    reader = Kmsg(str(log))
    assert [r.message for r in reader.read()] == ["first"]
    with log.open("ab") as f:
        f.write(b"ond\n6,3,30,-;third\n")
    assert [r.message for r in reader.read()] == ["second", "third"]
    assert reader.read() == []
    reader.close()
    missing = Kmsg(str(tmp_path / "none"))
    assert missing.read() == []
    assert "No such file" in str(missing.error)


def test_this_machine_s_kernel_log_reads_in_that_format() -> None:
    """The real /dev/kmsg (where this kernel lets us read it): every record parses, in order; a
    record root writes is not the kernel's (facility LOG_USER), so a forged Xid line is no fault."""
    reader = Kmsg("/dev/kmsg")
    records = reader.read()
    if reader.error is not None:
        pytest.skip(f"the kernel's log is closed here: {reader.error}")
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs)
    marker = f"kimi-deploy test {os.getpid()} NVRM: Xid (PCI:0000:ca:00): 79, GPU has fallen off the bus."
    try:
        with open("/dev/kmsg", "w", encoding="utf-8") as f:
            f.write(marker + "\n")
    except OSError as exc:
        pytest.skip(f"/dev/kmsg is not writable here: {exc}")
    deadline = time.monotonic() + 5
    mine: list[Any] = []
    while not mine and time.monotonic() < deadline:
        mine = [r for r in reader.read() if marker in r.message]
    reader.close()
    assert mine
    assert mine[0].facility != KERNEL
    assert abs(mine[0].usec / 1e6 - time.monotonic()) < 60  # the kernel's clock runs with CLOCK_MONOTONIC


def _dog(tmp_path: Path, kmsg: Path) -> watchdog.Watchdog:
    unit = {"unit": "kimi-vllm", "url": None}
    config = {
        "restart_after": 1,
        "restarts": 1,
        "canary_interval_s": 30,
        "canary_timeout_s": 10,
        "grace_s": 0,
        "timeout_s": 5,
        "interval_s": 1,
        "state": str(tmp_path / "state.json"),
        "units": [unit],
        "kmsg": str(kmsg),
        "xid_ignore": list(APPLICATION_XIDS),
        "textfile": str(tmp_path / "w.prom"),
    }
    return watchdog.Watchdog(config)


def _record(seq: int, usec: float, message: str, prio: int = 3) -> bytes:
    return f"{prio},{seq},{int(usec)},-;{message}\n".encode()


def test_an_xid_drains_the_engine_that_ran_when_it_came_and_not_one_started_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog's round on a file in /dev/kmsg's format: an application's Xid (13) and a line
    root wrote are no fault; an Xid 79 after the engine started drains it; the engine started
    again after it (a converge) serves; the metrics count the Xids read."""
    said: list[str] = []
    acted: list[str] = []
    monkeypatch.setattr(watchdog, "log", said.append)
    monkeypatch.setattr(watchdog.Watchdog, "_act", lambda self, unit, action, why, now: acted.append(action))
    now_us = time.monotonic() * 1e6
    started_us = now_us - 60e6
    shown = {
        "kimi-vllm": {
            "ActiveState": "active",
            "NRestarts": "0",
            "ExecMainStartTimestampMonotonic": str(int(started_us)),
        }
    }
    monkeypatch.setattr(watchdog, "systemd", lambda units: shown)
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        _record(
            1, started_us - 30e6, "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error"
        )
        + _record(2, now_us - 20e6, "NVRM: Xid (PCI:0000:3b:00): 13, pid=9, name=python3, Graphics Exception")
        + _record(3, now_us - 10e6, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", prio=12)
    )
    dog = _dog(tmp_path, kmsg)
    dog.round()
    assert acted == []  # the 48 came before this engine started, 13 is the application's, 3 is root's
    with kmsg.open("ab") as f:
        f.write(
            _record(
                4,
                now_us,
                "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            )
        )
        f.write(_record(5, now_us, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."))
    dog.round()
    assert acted == ["stop"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["units"]["kimi-vllm"]["state"] == "drained"
    assert state["units"]["kimi-vllm"]["why"] == "accelerators: Xid 79 on GPU 0000:3b:00: 'GPU has fallen off the bus.'"
    assert [x["code"] for x in state["host"]["xid"]] == [48, 79]
    assert "host: Xid 79 on GPU 0000:3b:00: 'GPU has fallen off the bus.'" in said
    metrics = (tmp_path / "w.prom").read_text()
    assert 'kimi_watchdog_xid_events_total{xid="79"} 1' in metrics
    assert 'kimi_watchdog_xid_events_total{xid="48"} 1' in metrics
    assert "kimi_watchdog_kernel_log_readable 1" in metrics
    shown["kimi-vllm"]["ExecMainStartTimestampMonotonic"] = str(int(time.monotonic() * 1e6) + 1)
    dog.round()
    assert acted == ["stop"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["units"]["kimi-vllm"]["state"] == "serving"


def test_an_unreadable_kernel_log_is_said_once_and_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(watchdog, "log", said.append)
    monkeypatch.setattr(watchdog, "systemd", lambda units: {})
    dog = _dog(tmp_path, tmp_path / "no-kmsg")
    dog.round()
    dog.round()
    assert [line for line in said if "kernel's log" in line] == [
        f"host: the kernel's log cannot be read, Xid events go unseen ({tmp_path}/no-kmsg: No such file or directory)"
    ]
    assert "kimi_watchdog_kernel_log_readable 0" in (tmp_path / "w.prom").read_text()
