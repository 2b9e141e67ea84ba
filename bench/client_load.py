"""What the limit benches share: a server process's figures, and the loads clients without a key
send it (bounded loops on loopback that stop by themselves)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def proc_status(pid: int, field: str) -> int:
    """A number from the process's status (``Threads``, ``VmRSS``, ``VmHWM``); -1 once it exited."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return -1


def connect(port: int, source: str | None = None) -> socket.socket:
    """A connection to 127.0.0.1:``port``, from the loopback address ``source`` when given."""
    s = socket.socket()
    if source:
        s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    return s


def big_headers(port: int, pid: int, count: int, path: str, source: str | None = None) -> dict[str, int]:
    """``count`` connections at once, each sending a request head of 99 headers of 65,000 bytes:
    the server's peak resident memory (VmHWM, KiB) afterwards."""
    head = f"GET {path} HTTP/1.1\r\n".encode() + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 65_000) for i in range(99))

    def one() -> None:
        with contextlib.suppress(OSError), connect(port, source) as s:
            s.settimeout(20)
            s.sendall(head)
            time.sleep(3)  # hold the connection while the others arrive

    workers = [threading.Thread(target=one) for _ in range(count)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    return {"big_header_connections": count, "peak_rss_kib": proc_status(pid, "VmHWM")}


def half_sent(port: int, request_line: str, source: str | None = None) -> dict[str, float]:
    """One request head sent half: seconds until the server closes it (at most 45)."""
    with connect(port, source) as s:
        s.sendall(f"{request_line}\r\nHost: x\r\n".encode())
        started = time.monotonic()
        s.settimeout(45)
        with contextlib.suppress(OSError):
            while s.recv(4096):
                pass
        return {"half_sent_closed_after_s": round(time.monotonic() - started, 1)}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(
    command: list[str],
    port: int,
    log: Path,
    phases: list[Callable[[int], dict[str, Any]]],
    env: dict[str, str] | None = None,
) -> dict[str, object]:
    """Start the server ``command`` (stderr to ``log``), wait for it on ``port``, run each phase on
    its pid while it lives, and stop it: the phases' figures, ``alive``, and the server's last log
    line when it died."""
    result: dict[str, object] = {}
    with log.open("w") as stderr:
        proc = subprocess.Popen(command, stderr=stderr, env=env)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
                time.sleep(0.05)
            time.sleep(6)  # the probe connection above is gone before measuring
            result["rss_kib_at_start"] = proc_status(proc.pid, "VmRSS")
            for phase in phases:
                if proc.poll() is not None:
                    break
                result |= phase(proc.pid)
            result["alive"] = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    if not result["alive"]:
        lines = log.read_text(errors="replace").strip().splitlines()
        result["died"] = lines[-1] if lines else f"exit {proc.returncode}"
    return result
