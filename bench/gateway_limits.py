"""What clients without the key can make the gateway spend, on loopback.

    python bench/gateway_limits.py [--program FILE] [--idle 2000] [--big 60]

Starts ``hostside/gateway.py`` (bundled, or ``--program``: a file to run as it is, such as an older
version) on 127.0.0.1 with the production config's limits (its defaults; ``timeout_s`` 600) and a
fallback, and measures, one after the other:
- ``--idle`` connections that send nothing: the gateway's peak thread count while they open and a
  second later, how many it answered 503 at once, and how many it still holds open 8 s later;
- ``--big`` connections each sending a request head of 99 headers of 65,000 bytes: the gateway's
  peak resident memory (VmHWM) afterwards;
- one request head sent half: seconds until the gateway closes it (at most 45).
Every loop is bounded and every socket closed at the end; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client_load import big_headers, connect, free_port, half_sent, measure, proc_status  # noqa: E402 - beside this file

from kimi_deploy.hostside_command import bundle  # noqa: E402 - after the path is set


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
    return {"idle_connections": len(conns), "opened_in_s": round(opened_s, 1), "peak_threads": peak[0],
            "threads": threads, "answered_503": busy, "open_after_9s": still}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, help="a gateway.py to run as it is (default: the bundled one)")
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--big", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        program = args.program or folder / "gateway.py"
        if args.program is None:
            program.write_text(bundle("gateway.py"), encoding="utf-8")
        port = free_port()
        config = {"bind": "127.0.0.1", "port": port, "backend": "http://127.0.0.1:9", "served_name": "kimi",
                  "fallback": {"url": "http://127.0.0.1:9", "model": "hosted"}}  # fmt: skip
        (folder / "gateway.json").write_text(json.dumps(config))
        env = {**os.environ, "KIMI_API_KEY": "c" * 43, "KIMI_FALLBACK_API_KEY": "h" * 43}
        env.pop("NOTIFY_SOCKET", None)
        command = [sys.executable, str(program), "--config", str(folder / "gateway.json")]
        result: dict[str, object] = {"program": str(args.program or "hostside/gateway.py")}
        result |= measure(command, port, folder / "gateway.log", [
            lambda pid: _idle(port, pid, args.idle),
            lambda pid: big_headers(port, pid, args.big, "/v1/models"),
            lambda pid: half_sent(port, "POST /v1/chat/completions HTTP/1.1"),
        ], env)  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
