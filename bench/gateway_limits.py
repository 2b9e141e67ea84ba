"""What clients without the key can make the gateway spend, on loopback.

    python bench/gateway_limits.py [--idle 2000] [--big 60]

Starts the gateway as the deploy configures it (Debian's nginx with the deploy's templates, rendered
by harness/gateway_local.py with the production limits and a fallback) on 127.0.0.1, and measures on
its worker process, one after the other:
- ``--idle`` connections that send nothing: the worker's peak thread count while they open and a
  second later, how many were answered 503 at once, and how many are still open 8 s later;
- ``--big`` connections each sending a request head of 99 headers of 65,000 bytes: the worker's
  peak resident memory (VmHWM) afterwards;
- one request head sent half: seconds until the gateway closes it (at most 45).
Every loop is bounded and every socket closed at the end; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from client_load import big_headers, connect, free_port, half_sent, measure, proc_status

from harness.gateway_local import nginx, render

ROOT = Path(__file__).resolve().parent.parent


def _state(s: socket.socket) -> str:
    """The socket's state without waiting: open, busy (answered 503 and closed) or closed."""
    s.setblocking(False)
    try:
        said = s.recv(64)
    except BlockingIOError:
        return "open"
    except OSError:
        return "closed"
    return "busy" if said.startswith(b"HTTP/1.1 503") else "closed"


def _idle(port: int, pid: int, count: int) -> dict[str, float]:
    conns: list[socket.socket] = []
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], proc_status(pid, "Threads"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    try:
        for _ in range(count):
            try:
                conns.append(connect(port))
            except OSError:
                break
        opened_s = time.monotonic() - started
        time.sleep(1)
        threads = proc_status(pid, "Threads")
        busy = sum(_state(s) == "busy" for s in conns)
        time.sleep(8)
        still = sum(_state(s) == "open" for s in conns)
    finally:
        done.set()
        sampler.join()
        for s in conns:
            s.close()
    return {
        "idle_connections": len(conns),
        "opened_in_s": round(opened_s, 1),
        "peak_threads": peak[0],
        "threads": threads,
        "answered_503": busy,
        "open_after_9s": still,
    }


def worker(master: int) -> int:
    """nginx's one worker process, the child of ``master`` that serves the connections."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise SystemExit(f"nginx (pid {master}) started no worker within 10 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--big", type=int, default=60)
    args = parser.parse_args()
    binary = nginx()
    if binary is None:
        raise SystemExit("nginx is not installed: apt-get install nginx libnginx-mod-http-js")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        port = free_port()
        keys = {"KIMI_API_KEY": "c" * 43, "KIMI_FALLBACK_API_KEY": "h" * 43}
        conf = render(
            folder,
            keys,
            bind="127.0.0.1",
            port=port,
            backend_port=9,
            fallback_url="http://127.0.0.1:9",
            served_name="kimi",
            hosted_model="hosted",
            hosted_max_tokens=4096,
        )
        command = [binary, "-c", str(conf), "-e", "stderr"]
        result: dict[str, object] = {"program": f"{binary} with templates/gateway.nginx.conf.j2"}
        result |= measure(
            command,
            port,
            folder / "gateway.log",
            [
                lambda pid: {"worker_rss_kib_at_start": proc_status(worker(pid), "VmRSS")},
                lambda pid: _idle(port, worker(pid), args.idle),
                lambda pid: big_headers(port, worker(pid), args.big, "/v1/models"),
                lambda pid: half_sent(port, "POST /v1/chat/completions HTTP/1.1"),
            ],
        )
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
