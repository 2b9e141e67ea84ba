"""What a systemd unit uses: its CPU time and its memory, read on its host.

systemd's own account (``CPUUsageNSec``, ``MemoryCurrent``) where its accounting is on; else the
sum over the unit's running processes, from its main process down (``/proc/PID/task/*/children``):
an engine's API server and its engine core live as long as the unit does, so the sum is the
unit's use while it serves.
"""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess


def _show(unit: str, *props: str) -> dict[str, str]:
    args = [x for p in props for x in ("-p", p)]
    shown = subprocess.run(
        ["systemctl", "show", *args, f"{unit}.service"], capture_output=True, text=True, check=False, timeout=30
    )
    return dict(line.partition("=")[::2] for line in shown.stdout.splitlines())


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    found, todo = [], [pid]
    while todo:
        one = todo.pop()
        found.append(one)
        for children in glob.glob(f"/proc/{one}/task/*/children"):
            with contextlib.suppress(OSError), open(children, encoding="ascii") as f:
                todo += [int(c) for c in f.read().split()]
    return found


def _stat_cpu_s(pid: int) -> float:
    """The CPU time ``pid`` used (user and system: fields 14 and 15 of ``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _main_pid(values: dict[str, str]) -> int | None:
    pid = values.get("MainPID", "0")
    return int(pid) if pid.isdigit() and pid != "0" else None


def cpu_s(unit: str) -> float | None:
    """The CPU seconds ``unit`` has used; None when it runs no process and systemd keeps no account."""
    values = _show(unit, "CPUUsageNSec", "MainPID")
    if values.get("CPUUsageNSec", "").isdigit():
        return int(values["CPUUsageNSec"]) / 1e9
    pid = _main_pid(values)
    return None if pid is None else sum(_stat_cpu_s(p) for p in tree(pid))


def memory_mib(unit: str) -> int | None:
    """The memory ``unit`` holds now, in MiB; None when it runs no process and systemd keeps no account."""
    values = _show(unit, "MemoryCurrent", "MainPID")
    if values.get("MemoryCurrent", "").isdigit():
        return int(values["MemoryCurrent"]) >> 20
    pid = _main_pid(values)
    return None if pid is None else sum(_rss_kib(p) for p in tree(pid)) >> 10
