"""A converge cut short, and clients beside it: what the bad-day tests and benchmarks share.

``cut`` runs ``pyinfra INVENTORY deploys/kimi.py`` and sends it a signal once its log shows a
given line (SIGKILL: the controller's laptop gone; SIGINT: Ctrl-C). ``EngineRounds`` asks each
engine for a short answer every second, directly, and records which answered in each round: a
round in which none did is a topology that was down. ``GatewayLoad`` streams chat completions
through a topology's gateway and router in a loop, as a client behind the router does, and
records every failure: a stream cut by an engine that stopped under it is one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.own_cluster import BIN, ROOT
from harness.ssh import root_ssh

PROMPT = "Reply with exactly the word READY and nothing else."
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_until(
    args: Sequence[str], at: str, act: Callable[[subprocess.Popen[str]], object], after_s: float, env: Mapping[str, str]
) -> tuple[int, str]:
    """``pyinfra ARGS`` (``-y`` added), ``act`` done ``after_s`` once its log shows ``at`` (a
    regular expression, matched without colours): its exit status (negative: the signal that ended
    it) and its log. ``AssertionError`` when the line never came."""
    proc = subprocess.Popen(
        [str(BIN / "pyinfra"), *args, "-y"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.stdout is not None
    lines: list[str] = []
    done = False
    for line in proc.stdout:
        lines.append(line)
        if not done and re.search(at, _ANSI.sub("", line)):
            time.sleep(after_s)
            act(proc)
            done = True
    code = proc.wait(timeout=600)
    assert done, f"the log never showed {at!r}:\n" + "".join(lines)[-4000:]
    return code, "".join(lines)


def cut(inventory: Path, at: str, sig: signal.Signals, after_s: float, env: Mapping[str, str]) -> tuple[int, str]:
    """A converge (``deploys/kimi.py`` on ``inventory``) sent ``sig`` ``after_s`` once its log shows
    ``at`` (``run_until``)."""
    return run_until([str(inventory), "deploys/kimi.py"], at, lambda proc: proc.send_signal(sig), after_s, env)


def tunnel(state: dict[str, Any], address: str, port: int = 8000) -> tuple[subprocess.Popen[bytes], str]:
    """An SSH tunnel from this machine's loopback to ``address:port`` through the host itself (an
    engine behind a router takes connections from its own host and the router's alone): the
    tunnel's process and the URL it gives."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    proc = subprocess.Popen(
        root_ssh(state, address, "-o", "ExitOnForwardFailure=yes", "-N", "-L", f"127.0.0.1:{local}:{address}:{port}"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", local), timeout=1):
            break
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{local}"


def _chat(url: str, key: str, *, stream: bool, timeout_s: float) -> bool:
    """Whether ``url`` answered a short chat completion whole (a stream: to its ``[DONE]``)."""
    body = {"model": "kimi-local", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "stream": stream}
    request = urllib.request.Request(  # noqa: S310 - the cluster's own http:// URLs
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - as above
            text = response.read(1 << 20)
    except (OSError, ValueError):
        return False
    if stream:
        return bool(text.rstrip().endswith(b"data: [DONE]"))
    try:
        return bool(json.loads(text)["choices"])
    except (ValueError, KeyError, TypeError):
        return False


@dataclass
class EngineRounds:
    """Every second, a short chat request to each engine (``urls``: name -> API base): per
    round, which answered within 5 s."""

    urls: dict[str, str]
    key: str
    rounds: list[dict[str, bool]] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            answered = {name: _chat(url, self.key, stream=False, timeout_s=5) for name, url in self.urls.items()}
            self.rounds.append(answered)
            self.stopped.wait(max(0.0, 1.0 - (time.monotonic() - started)))

    @staticmethod
    def answers(url: str, key: str) -> bool:
        """Whether the engine at ``url`` answers a short chat completion within 5 s."""
        return _chat(url, key, stream=False, timeout_s=5)

    def stop(self) -> list[dict[str, bool]]:
        self.stopped.set()
        self.thread.join(timeout=30)
        return self.rounds

    def none_answered(self) -> list[int]:
        """The rounds in which no engine answered."""
        return [i for i, r in enumerate(self.rounds) if not any(r.values())]


@dataclass
class GatewayLoad:
    """``concurrency`` clients streaming chat completions through the gateway at ``url`` in a loop,
    each ``pause_s`` between two (a steady load that leaves an engine loading beside it the cores
    it needs: two cores, back to back, starved a restarting vLLM's compile for minutes)."""

    url: str
    key: str
    concurrency: int = 2
    pause_s: float = 0.5
    answered: int = 0
    failed: list[float] = field(default_factory=list)  # when each failed request started
    stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.concurrency)]
        for t in self.threads:
            t.start()

    def _client(self) -> None:
        while not self.stopped.is_set():
            started = time.time()
            if _chat(self.url, self.key, stream=True, timeout_s=60):
                self.answered += 1
            else:
                self.failed.append(started)
            self.stopped.wait(self.pause_s)

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=70)


@dataclass
class Tunnelled:
    """An engine asked through an SSH tunnel to its host (``tunnel``), the tunnel made again once
    the host dropped it (a reboot)."""

    state: dict[str, Any]
    address: str
    key: str
    tunnels: list[tuple[subprocess.Popen[bytes], str]] = field(default_factory=list)

    def answers(self) -> bool:
        """Whether the engine answers a short chat completion within 5 s."""
        if not self.tunnels or self.tunnels[-1][0].poll() is not None:
            self.tunnels.append(tunnel(self.state, self.address))
        return EngineRounds.answers(self.tunnels[-1][1], self.key)

    def close(self) -> None:
        for proc, _ in self.tunnels:
            proc.terminate()


_BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


def rebooted(run: Callable[[str], str], serving: Callable[[], bool], within_s: float = 300) -> float | None:
    """A host rebooted by systemd, as an operator's ``systemctl reboot`` (``run``: a command on it
    over SSH, its stdout; it may fail while the host is down): the seconds from the reboot until
    ``serving()`` holds on its new boot, None when it did not within ``within_s``."""
    boot = run(_BOOT_ID)
    started = time.monotonic()
    run("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &")
    while time.monotonic() - started < within_s:
        time.sleep(2)
        try:
            now = run(_BOOT_ID)
        except (subprocess.SubprocessError, OSError):  # down while it reboots
            continue
        if now not in ("", boot) and serving():
            return time.monotonic() - started
    return None


def drain_lines(log: str) -> list[str]:
    """What the converge said of each drain (``operations.serving.drain_line``)."""
    return [_ANSI.sub("", line).strip() for line in log.splitlines() if "drained" in line and "sends no new" in line]


def gap_lines(log: str) -> list[str]:
    """What the converge said of each engine's time without service (``operations.serving.smoke_line``)."""
    return [_ANSI.sub("", line).strip() for line in log.splitlines() if "answers again" in line and " s " in line]
