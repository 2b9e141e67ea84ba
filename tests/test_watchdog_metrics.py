"""The watchdog's metrics file (``hostside/watchdog.py``, read by the node exporter's textfile
collector) as Debian's ``promtool check metrics`` reads it (the ``prometheus`` package, 2.42 on
Debian 12; scripts/test installs it): the exposition of real rounds on a host in trouble (its GPUs
present, one with uncorrected ECC errors and a row pending remapping, Xid events in the kernel's
log, a scrub that left a corrupted file, a canary back) parses, and its lint (HELP text, a
counter's ``_total``, units) reports nothing. The binary is Debian's; nothing here stands in for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from kimi_deploy.hostside import watchdog
from tests.hostile_http import Hostile, answer

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

PROMTOOL = "/usr/bin/promtool"

# Every family the watchdog exports, and its type: the names dashboards and alerts are written against.
FAMILIES = {
    "kimi_watchdog_up": "gauge",
    "kimi_watchdog_state": "gauge",
    "kimi_watchdog_actions_total": "counter",
    "kimi_watchdog_systemd_restarts_total": "counter",
    "kimi_watchdog_canary_seconds": "gauge",
    "kimi_watchdog_accelerators_present": "gauge",
    "kimi_watchdog_accelerators_expected": "gauge",
    "kimi_watchdog_ecc_uncorrected_errors_total": "counter",
    "kimi_watchdog_gpus_retirement_pending": "gauge",
    "kimi_watchdog_xid_events_total": "counter",
    "kimi_watchdog_kernel_log_readable": "gauge",
    "kimi_watchdog_scrub_corrupt_files": "gauge",
    "kimi_watchdog_last_round_timestamp_seconds": "gauge",
}

# Eight GPUs as an H100 on 590.48.01 answers (utkuozdemir/nvidia_gpu_exporter's capture: rows are
# remapped, pages not retired), the fourth with 2 uncorrected errors and a row pending remapping.
GPUS = "".join(
    f"{i}, 00000000:{0x18 + i:02X}:00.0, {2 if i == 3 else 0}, [N/A], {'Yes' if i == 3 else 'No'}, Completed, Success\n"
    for i in range(8)
)
# ``systemctl show`` of an engine systemd restarted twice, and of a worker without an API.
SHOWN = "".join(
    f"Id={unit}.service\nActiveState=active\nSubState=running\nResult=success\nNRestarts={n}\n"
    "ExecMainStartTimestampMonotonic=1\n\n"
    for unit, n in (("kimi-vllm", 2), ("kimi-worker", 0))
)
CHAT_READY = answer({"choices": [{"index": 0, "message": {"role": "assistant", "content": "READY"}}]})


def _tools(folder: Path) -> None:
    """``nvidia-smi`` printing GPUS, and ``systemctl`` printing SHOWN (its restarts and stops succeed)."""
    folder.mkdir()
    scripts = {
        "nvidia-smi": f"cat <<'EOF'\n{GPUS}EOF\n",
        "systemctl": f"[ \"$1\" = show ] || exit 0\ncat <<'EOF'\n{SHOWN}EOF\n",
    }
    for name, body in scripts.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}", encoding="utf-8")
        (folder / name).chmod(0o755)


def _record(seq: int, usec: float, message: str) -> bytes:
    """A kernel's log record in ``/dev/kmsg``'s format (level 3, facility kernel)."""
    return f"3,{seq},{int(usec)},-;{message}\n".encode()


def _promtool(text: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` of ``text``: exit 0 and silent when it finds no problem (3 for a
    lint's, 1 for a parse error; each problem is a line on stderr)."""
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def exposition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The metrics file the watchdog writes on a host in trouble, once a canary has come back."""
    _tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(watchdog, "log", lambda line: None)
    now_us = time.monotonic() * 1e6
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        _record(1, now_us - 20e6, "NVRM: Xid (PCI:0000:1b:00): 48, pid=1, name=x, An uncorrectable double bit error")
        + _record(2, now_us - 10e6, "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus.")
    )
    scrub = tmp_path / "scrub.json"
    scrub.write_text('{"corrupted": ["model-00001-of-00064.safetensors"], "repaired": [], "time": 1}\n')
    textfile = tmp_path / "kimi_watchdog.prom"
    with Hostile({"/health": answer(b""), "/v1/chat/completions": CHAT_READY}) as engine:
        engine_unit = {
            "unit": "kimi-vllm",
            "url": engine.url,
            "served_name": "kimi",
            "prompt": "Say READY.",
            "expect": "READY",
            "max_tokens": 8,
            "key_file": None,
            "key_var": "VLLM_API_KEY",
        }
        config = {
            "interval_s": 1,
            "timeout_s": 5,
            "canary_interval_s": 3600,
            "canary_timeout_s": 5,
            "restart_after": 1,
            "restarts": 1,
            "grace_s": 0,
            "state": str(tmp_path / "state.json"),
            "textfile": str(textfile),
            "units": [engine_unit, {"unit": "kimi-worker", "url": None}],
            "accelerators": {"vendor": "nvidia", "count": 8},
            "scrub": str(scrub),
            "kmsg": str(kmsg),
            "xid_ignore": [],
        }
        dog = watchdog.Watchdog(config)
        deadline = time.monotonic() + 20
        while True:  # the canary goes out in the first round and is read in a later one
            dog.round()
            text = textfile.read_text(encoding="utf-8")
            if "kimi_watchdog_canary_seconds{" in text or time.monotonic() > deadline:
                return text
            time.sleep(0.1)


def test_every_family_is_named_and_typed_as_prometheus_conventions_want(exposition: str) -> None:
    lines = exposition.splitlines()
    assert dict(re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE)) == FAMILIES
    # every family has samples: promtool drops a family without any before its lint
    assert {line.split("{")[0].split(" ")[0] for line in lines if not line.startswith("#")} == set(FAMILIES)
    for line in (
        'kimi_watchdog_systemd_restarts_total{unit="kimi-vllm"} 2',
        "kimi_watchdog_accelerators_present 8",
        "kimi_watchdog_accelerators_expected 8",
        "kimi_watchdog_ecc_uncorrected_errors_total 2",
        "kimi_watchdog_gpus_retirement_pending 1",
        'kimi_watchdog_xid_events_total{xid="79"} 1',
        'kimi_watchdog_actions_total{unit="kimi-vllm",action="stop"} 1',
        "kimi_watchdog_scrub_corrupt_files 1",
    ):
        assert line in lines, exposition


def test_promtool_check_metrics_finds_no_problem(exposition: str) -> None:
    run = _promtool(exposition)
    assert (run.returncode, run.stdout + run.stderr) == (0, ""), exposition


def test_promtool_reports_what_the_conventions_refuse() -> None:
    """The lint the test above relies on: a counter named without ``_total``, a family without
    HELP and an abbreviated unit are each reported."""
    run = _promtool(
        "# HELP kimi_restarts Restarts.\n# TYPE kimi_restarts counter\nkimi_restarts 1\n"
        "# TYPE kimi_widgets gauge\nkimi_widgets 1\n"
        "# HELP kimi_latency_ms Milliseconds.\n# TYPE kimi_latency_ms gauge\nkimi_latency_ms 1\n"
    )
    assert run.returncode == 3
    assert sorted(run.stderr.splitlines()) == [
        "kimi_latency_ms metric names should not contain abbreviated units",
        'kimi_restarts counter metrics should have "_total" suffix',
        "kimi_widgets no help text",
    ]
