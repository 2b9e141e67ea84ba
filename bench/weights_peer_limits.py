"""What unauthenticated clients can make the weights peer spend, on loopback.

    python bench/weights_peer_limits.py [--program FILE] [--idle 2000] [--big 60]

Starts ``hostside/weights_peer.py`` (bundled, or ``--program``: a file to run as it is, such as an
older version) on 127.0.0.1, answering 127.0.0.2 only, and measures, one after the other:
- ``--idle`` connections from 127.0.0.2 that send nothing: the peer's most threads while they
  arrive and a second later, and how long until it closed them all (how many it holds after 30 s);
- ``--big`` connections from 127.0.0.3 (outside the run) each sending a request head of 99 headers
  of 65,000 bytes: the peer's peak resident memory (VmHWM) afterwards;
- one request head sent half, from 127.0.0.2: seconds until the peer closes it (at most 45).
Every loop is bounded and every socket closed at the end; prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from client_load import big_headers, connect, free_port, half_sent, measure, proc_status

from kimi_deploy.host.command import bundle, pack

ROOT = Path(__file__).resolve().parent.parent


def _closed_by_peer(s: socket.socket) -> bool:
    """Whether the peer closed ``s`` (whatever it answered before)."""
    s.setblocking(False)
    try:
        while s.recv(4096):
            pass
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


def _idle(port: int, pid: int, count: int) -> dict[str, int | None]:
    conns: list[socket.socket] = []
    threads = 0
    try:
        for i in range(count):
            try:
                conns.append(connect(port, "127.0.0.2"))
            except OSError:
                break
            if i % 50 == 0:
                threads = max(threads, proc_status(pid, "Threads"))
        time.sleep(1)
        threads = max(threads, proc_status(pid, "Threads"))
        open_ = list(conns)
        waited = 1
        while open_ and waited < 30:
            time.sleep(1)
            waited += 1
            open_ = [s for s in open_ if not _closed_by_peer(s)]
    finally:
        for s in conns:
            s.close()
    return {
        "idle_connections": len(conns),
        "threads": threads,
        "idle_open_after_30s": len(open_),
        "idle_all_closed_within_s": waited if not open_ else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", type=Path, help="a weights_peer.py to run as it is (default: the bundled one)")
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--big", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "rev").mkdir()
        (folder / "rev" / "a.bin").write_bytes(b"weights")
        (folder / "key").write_text("k" * 43 + "\n")
        program = args.program or folder / "weights_peer.py"
        if args.program is None:
            program.write_text(bundle("weights_peer.py"), encoding="utf-8")
        port = free_port()
        lock = {"a.bin": [7, "sha256:" + "0" * 64]}
        request = {
            "dir": str(folder / "rev"),
            "lock": lock,
            "bind": "127.0.0.1",
            "port": port,
            "allow": ["127.0.0.2"],
            "key_file": str(folder / "key"),
            "idle_exit_s": 300,
        }
        result: dict[str, object] = {"program": str(args.program or "kimi_deploy/hostside/weights_peer.py")}
        result |= measure(
            [sys.executable, str(program), pack(request)],
            port,
            folder / "peer.log",
            [
                lambda pid: _idle(port, pid, args.idle),
                lambda pid: big_headers(port, pid, args.big, "/a.bin", "127.0.0.3"),
                lambda pid: half_sent(port, "GET /a.bin HTTP/1.1", "127.0.0.2"),
            ],
        )
    print(json.dumps(result))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
