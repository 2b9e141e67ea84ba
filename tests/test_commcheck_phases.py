"""hostside/commcheck.py in the three steps a converge takes (listen, probe, verdict), on simulated
hosts at loopback addresses (127.0.0.2, ...) as in test_commcheck.py: every listener is up before
any probe, every probe is done before any verdict, and no step waits for another host to start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import hostside_command
from tests.test_commcheck import TOKEN, topology

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def _command(request: dict[str, Any], phase: str) -> str:
    return hostside_command(sys.executable, "commcheck.py", {**request, "phase": phase, "lifetime_s": 60})


def _accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=0.2).close()
    except OSError:
        return False
    return True


@contextmanager
def listeners(
    requests: list[dict[str, Any]], env: dict[str, str] | None = None
) -> Iterator[list[subprocess.Popen[str]]]:
    """The listen step on each of ``requests``' hosts, up (its check port accepts) on return."""
    environ = {**os.environ, **(env or {})}
    # exec: the signal that stops it reaches the listener, as systemd's does
    out, err = subprocess.PIPE, subprocess.PIPE
    procs = [
        subprocess.Popen(
            "exec " + _command(r, "listen"),
            shell=True,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            text=True,
            env=environ,
        )
        for r in requests
    ]
    for proc in procs:  # the check's token, as the controller sends it: never in argv
        assert proc.stdin is not None
        proc.stdin.write(TOKEN + "\n")
        proc.stdin.close()
    try:
        until = time.monotonic() + 10
        for request in requests:
            while not _accepts(request["address"], request["port"]):
                assert time.monotonic() < until, "a listener did not come up"
                time.sleep(0.05)
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.communicate(timeout=10)


def _step(request: dict[str, Any], phase: str) -> tuple[int, dict[str, Any], str]:
    run = subprocess.run(
        _command(request, phase),
        shell=True,
        input=TOKEN + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout + run.stderr
    return run.returncode, json.loads(lines[0]), run.stderr


def test_hosts_probing_one_after_another_pass_and_each_verdict_names_every_pair() -> None:
    topo = topology(4, bandwidth={"bytes": 1 << 20, "min_mbit_s": 1, "max_s": 2}, deadline=3.0)
    with listeners(topo.requests) as procs:
        # One host at a time, each well after the others' whole check window: no rendezvous needed.
        for request in topo.requests:
            rc, probed, err = _step(request, "probe")
            assert (rc, err, probed["ok"]) == (0, "", True), err
            time.sleep(0.5)
        time.sleep(3.5)  # longer than the deadline: a verdict never waits for a peer's start
        for request in topo.requests:
            rc, result, err = _step(request, "verdict")
            assert (rc, err) == (0, ""), err
            assert result["ok"] is True
            peers = [r["me"] for r in topo.requests if r["me"] != request["me"]]
            assert len(result["pairs"]) == len(peers) * 4
            assert {p: (r["received"], r["delivered"]) for p, r in result["reports"].items()} == dict.fromkeys(
                peers, (True, True)
            )
            for entry in result["listen"]:
                assert entry["accepted_from"] == sorted(peers)
    for proc in procs:
        assert proc.returncode == 0
    for request in topo.requests:  # every listener is gone
        assert not _accepts(request["address"], request["port"])


def test_a_host_whose_probe_did_not_run_and_one_without_listener_are_named_apart() -> None:
    topo = topology(4, deadline=2.0)
    # kimi-h4 never listens (its host is down); kimi-h3 listens but never probes (it failed before)
    with listeners(topo.requests[:3]):
        for request in topo.requests[:2]:
            assert _step(request, "probe")[0] == 0
        outcomes = [_step(request, "verdict") for request in topo.requests[:2]]
    check = topo.check
    for rc, result, err in outcomes:
        assert rc == 1
        lines = [f["message"] for f in result["failures"]]
        assert f"kimi-h4 did not report (host down? its comm check port {check}: connection refused)" in lines
        assert f"kimi-h3 did not report (it is up; can it reach {result['host']}:{check}?)" in lines
        assert err.startswith("kimi-deploy: comm check: ")
    # every host names the same first failure: the host that is down
    assert {err for _, _, err in outcomes} == {
        f"kimi-deploy: comm check: kimi-h4 did not report (host down? its comm check port {check}: connection refused)\n"
    }


def test_a_port_one_host_does_not_listen_on_fails_every_verdict_naming_the_pair() -> None:
    topo = topology(3, deadline=2.0)
    dist = topo.ports[0]
    topo.request("kimi-h2")["listen"] = [p for p in topo.request("kimi-h2")["listen"] if p != dist]
    with listeners(topo.requests):
        for request in topo.requests:
            assert _step(request, "probe")[0] == 0
        outcomes = [_step(request, "verdict") for request in topo.requests]
    first = f"kimi-h1 -> kimi-h2:{dist['port']} ({dist['label']}): connection refused"
    for rc, result, err in outcomes:
        assert rc == 1
        assert result["failures"][0]["message"] == first
        assert err == f"kimi-deploy: comm check: {first}\n"


def test_a_verdict_without_its_listener_says_so_in_one_line() -> None:
    topo = topology(2, deadline=1.0)
    rc, result, err = _step(topo.requests[0], "verdict")
    assert (rc, result["ok"]) == (1, False)
    said = f"kimi-deploy: comm check: kimi-h1: 127.0.0.2:{topo.check} (comm check): its listener is not running"
    assert err.startswith(said)


def test_the_listener_tells_systemd_it_is_ready_only_once_it_accepts() -> None:
    topo = topology(2)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(10)
            with listeners(topo.requests[:1], env={"NOTIFY_SOCKET": path}):
                said = sock.recv(100)
                assert _accepts(topo.requests[0]["address"], topo.check)
    assert said == b"READY=1"
