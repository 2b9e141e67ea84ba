"""hostside/commcheck.py: simulated hosts on loopback addresses (127.0.0.2, .3, ...), run at once.

Each host is a subprocess started with the same shell command the controller sends over SSH; Linux
routes all of 127/8 to lo, so every host has its own address, listeners and allow-list.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from kimi_deploy.host.command import HOSTSIDE, hostside_command

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

DEADLINE = 3.0
HELLO_BYTES = 4096
# The check's token, shared by every host of a run; it reaches each on standard input.
TOKEN = "dGhlLWNoZWNrcy10b2tlbi1mb3ItdGhpcy1ydW4"


@dataclass
class Outcome:
    rc: int
    result: dict[str, Any]
    stderr: str


def _bindable(port: int) -> bool:
    for last in range(1, 10):
        with socket.socket() as sock:
            try:
                sock.bind((f"127.0.0.{last}", port))
            except OSError:
                return False
    return True


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1-9, below the ephemeral range: no client socket (nor its TIME_WAIT) holds them."""
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        low = int(f.read().split()[0])
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(10000, max(low, 20000))
        if port not in ports and _bindable(port):
            ports.append(port)
    return ports


@dataclass
class Topology:
    check: int
    ports: list[dict[str, Any]]
    requests: list[dict[str, Any]]

    def request(self, host: str) -> dict[str, Any]:
        return next(r for r in self.requests if r["me"] == host)


def topology(hosts: int, bandwidth: dict[str, Any] | None = None, deadline: float = DEADLINE) -> Topology:
    """``hosts`` hosts kimi-h1.. at 127.0.0.2.., each listening on and reaching every engine port."""
    check, dist, nixl = free_ports(3)
    ports = [{"port": dist, "label": "vllm dist-init"}, {"port": nixl, "label": "nixl"}]
    names = [(f"kimi-h{i + 1}", f"127.0.0.{i + 2}") for i in range(hosts)]
    requests = [
        {
            "run": "test-run",
            "me": me,
            "address": address,
            "port": check,
            "listen": [dict(p) for p in ports],
            "peers": [{"host": h, "address": a, "ports": [dict(p) for p in ports]} for h, a in names if h != me],
            "bandwidth": bandwidth,
            "deadline_s": deadline,
        }
        for me, address in names
    ]
    return Topology(check, ports, requests)


def start(requests: list[dict[str, Any]]) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            hostside_command(sys.executable, "commcheck.py", request),
            shell=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for request in requests
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(TOKEN + "\n")
        proc.stdin.close()
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[Outcome]:
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        lines = out.splitlines()
        assert len(lines) == 1, out
        outcomes.append(Outcome(proc.returncode, json.loads(lines[0]), err))
    return outcomes


def run(requests: list[dict[str, Any]]) -> list[Outcome]:
    return finish(start(requests))


@contextmanager
def held(address: str, port: int, listen: bool = True, backlog: int = 16) -> Iterator[socket.socket]:
    """A port taken by some other process: listening (the kernel accepts for it) or only bound."""
    sock = socket.socket()
    sock.bind((address, port))
    if listen:
        sock.listen(backlog)
    try:
        yield sock
    finally:
        sock.close()


def pair(outcome: Outcome, to: str, port: int, kind: str = "connect") -> dict[str, Any]:
    return next(p for p in outcome.result["pairs"] if p["to"] == to and p["port"] == port and p["kind"] == kind)


def listen_entry(outcome: Outcome, port: int) -> dict[str, Any]:
    return next(e for e in outcome.result["listen"] if e["port"] == port)


def test_all_pairs_pass_and_every_listener_is_closed_afterwards() -> None:
    topo = topology(4, bandwidth={"bytes": 1 << 20, "min_mbit_s": 1, "max_s": 2})
    outcomes = run(topo.requests)
    names = [r["me"] for r in topo.requests]
    for outcome, request in zip(outcomes, topo.requests, strict=True):
        assert (outcome.rc, outcome.stderr) == (0, ""), outcome.stderr
        result = outcome.result
        assert result["ok"] is True
        assert result["failures"] == []
        peers = [n for n in names if n != request["me"]]
        # Per peer: two engine ports, the check port, the bandwidth.
        assert len(result["pairs"]) == len(peers) * 4
        assert all(p["ok"] and p["cause"] is None for p in result["pairs"])
        assert {p["reached"] for p in result["pairs"] if p["kind"] == "connect"} == {"comm check"}
        for p in result["pairs"]:
            if p["kind"] == "bandwidth":
                assert p["bytes"] == 1 << 20
                assert p["mbit_s"] >= 1
        assert result["reports"] == {
            peer: {"received": True, "ok": True, "delivered": True, "seconds": result["reports"][peer]["seconds"]}
            for peer in peers
        }
        for entry in result["listen"]:
            assert entry["state"] == "listening"
            assert sorted(entry["accepted_from"]) == peers
        assert result["rejected"] == []
    for request in topo.requests:
        for port in [topo.check] + [p["port"] for p in topo.ports]:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((request["address"], port), timeout=1).close()


def test_peer_port_held_by_an_accepting_process_counts_as_reachable() -> None:
    # The engine of the release serving now holds its port on kimi-h2; peers reaching it still prove the link.
    topo = topology(3)
    dist = topo.ports[0]["port"]
    with held("127.0.0.3", dist):
        outcomes = run(topo.requests)
    assert [(o.rc, o.stderr) for o in outcomes] == [(0, "")] * 3
    h1, h2, h3 = outcomes
    assert listen_entry(h2, dist) == {
        "port": dist,
        "label": "vllm dist-init",
        "state": "in use",
        "error": None,
        "accepted_from": [],
    }
    for outcome in (h1, h3):
        reached = pair(outcome, "kimi-h2", dist)
        assert (reached["ok"], reached["reached"]) == (True, "other")
        assert pair(outcome, "kimi-h2", topo.ports[1]["port"])["reached"] == "comm check"


def test_host_that_never_runs_is_named_by_every_other_host() -> None:
    topo = topology(3)
    procs = start(topo.requests[:2])  # kimi-h3 never starts
    # Meanwhile: a stranger's connection is closed without a word, and nothing listens beyond 127.0.0.2.
    until = time.monotonic() + 2
    while True:
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.9", 0))
            stranger.settimeout(2)
            try:
                stranger.connect(("127.0.0.2", topo.check))
                said = stranger.recv(100)
            except ConnectionRefusedError:  # not listening yet
                assert time.monotonic() < until
                time.sleep(0.05)
                continue
            except (ConnectionAbortedError, ConnectionResetError):  # closed before or right after the accept
                said = b""
        break
    assert said == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", topo.check), timeout=1).close()
    h1, h2 = finish(procs)
    line = (
        f"kimi-deploy: comm check: kimi-h3 did not report within 3 s "
        f"(host down? its comm check port {topo.check}: connection refused)\n"
    )
    assert (h1.rc, h1.stderr) == (1, line)
    assert (h2.rc, h2.stderr) == (1, line)
    assert h1.result["rejected"] == ["127.0.0.9"]
    for outcome in (h1, h2):
        assert outcome.result["ok"] is False
        assert outcome.result["reports"]["kimi-h3"] == {
            "received": False,
            "ok": None,
            "seconds": None,
            "delivered": False,
        }
        assert pair(outcome, "kimi-h3", topo.ports[0]["port"])["cause"] == "connection refused"
    assert h1.result["reports"]["kimi-h2"]["received"] is True


def test_port_missing_from_one_request_fails_every_host_naming_the_pair() -> None:
    topo = topology(3)
    nixl = topo.ports[1]["port"]
    topo.request("kimi-h2")["listen"] = [topo.ports[0]]  # kimi-h2 does not open nixl; its peers expect it
    outcomes = run(topo.requests)
    line = f"kimi-deploy: comm check: kimi-h1 -> kimi-h2:{nixl} (nixl): connection refused\n"
    assert [(o.rc, o.stderr) for o in outcomes] == [(1, line)] * 3
    h1, h2, h3 = outcomes
    refused = pair(h1, "kimi-h2", nixl)
    assert (refused["ok"], refused["cause"], refused["reached"]) == (False, "connection refused", None)
    assert refused["attempts"] > 1  # retried: peers start their listeners at different times
    assert pair(h3, "kimi-h2", nixl)["cause"] == "connection refused"
    assert pair(h2, "kimi-h1", nixl)["ok"] is True
    # Every host knows every failure, its own and those its peers reported.
    for outcome in outcomes:
        assert [f["message"] for f in outcome.result["failures"]] == [
            f"kimi-h1 -> kimi-h2:{nixl} (nixl): connection refused",
            f"kimi-h3 -> kimi-h2:{nixl} (nixl): connection refused",
        ]


def test_listen_port_taken_by_a_process_that_does_not_accept_fails_every_host() -> None:
    topo = topology(3)
    dist = topo.ports[0]["port"]
    with held("127.0.0.3", dist, listen=False):
        outcomes = run(topo.requests)
    line = (
        f"kimi-deploy: comm check: kimi-h2: 127.0.0.3:{dist} (vllm dist-init): port in use, "
        "but nothing accepts connections on it (connection refused)\n"
    )
    assert [(o.rc, o.stderr) for o in outcomes] == [(1, line)] * 3
    entry = listen_entry(outcomes[1], dist)
    assert (entry["state"], entry["error"]) == ("in use", "connection refused")
    assert pair(outcomes[0], "kimi-h2", dist)["cause"] == "connection refused"


def test_check_port_taken_on_a_host_fails_every_host() -> None:
    topo = topology(3)
    with held("127.0.0.3", topo.check):
        outcomes = run(topo.requests)
    line = (
        f"kimi-deploy: comm check: kimi-h2: 127.0.0.3:{topo.check} (comm check): cannot listen: "
        "address already in use\n"
    )
    assert [(o.rc, o.stderr) for o in outcomes] == [(1, line)] * 3
    assert listen_entry(outcomes[1], topo.check)["state"] == "failed"
    assert pair(outcomes[0], "kimi-h2", topo.check)["cause"] == (
        "answered, but not by this run's comm check (another process holds the port?)"
    )


def test_dropped_connection_attempts_are_named_timed_out() -> None:
    # A listener whose accept queue is full drops SYNs, as a firewall DROP rule would.
    topo = topology(2)
    (blocked,) = free_ports(1)
    topo.request("kimi-h1")["peers"][0]["ports"].append({"port": blocked, "label": "mooncake"})
    with held("127.0.0.3", blocked, backlog=0) as firewall:
        filler = socket.create_connection((firewall.getsockname()[0], blocked), timeout=1)
        with filler:
            outcomes = run(topo.requests)
    line = f"kimi-deploy: comm check: kimi-h1 -> kimi-h2:{blocked} (mooncake): timed out\n"
    assert [(o.rc, o.stderr) for o in outcomes] == [(1, line)] * 2
    assert pair(outcomes[0], "kimi-h2", blocked)["cause"] == "timed out"


def test_bandwidth_below_the_floor_is_named_with_the_measured_rate() -> None:
    topo = topology(2, bandwidth={"bytes": 2 << 20, "min_mbit_s": 10_000_000, "max_s": 1})
    outcomes = run(topo.requests)
    h1, h2 = outcomes
    measured = pair(h1, "kimi-h2", topo.check, kind="bandwidth")
    assert measured["ok"] is False
    assert measured["bytes"] == 2 << 20  # what the receiver acknowledged
    assert 0 < measured["mbit_s"] < 10_000_000
    line = f"kimi-deploy: comm check: kimi-h1 -> kimi-h2: {measured['mbit_s']:.1f} Mbit/s, needs >= 10000000 Mbit/s\n"
    assert [(o.rc, o.stderr) for o in outcomes] == [(1, line)] * 2
    assert re.fullmatch(r"\d+\.\d Mbit/s, needs >= 10000000 Mbit/s", measured["cause"])
    assert pair(h2, "kimi-h1", topo.check, kind="bandwidth")["ok"] is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"peers": [{"host": "kimi-h2", "address": "10.0.0", "ports": []}]},
            "peers[0].address: '10.0.0' is not an IP address (names are not resolved)",
        ),
        ({"port": 70000}, "request.port: 70000 is not a TCP port (1-65535)"),
        (
            {"listen": [{"port": 29500, "label": "vllm dist-init"}, {"port": 29500, "label": "again"}]},
            "request.listen: port 29500 is listed twice",
        ),
        (
            {"peers": [{"host": "kimi-h1", "address": "127.0.0.3", "ports": []}]},
            "peers[0].host: 'kimi-h1' is this host or listed twice",
        ),
    ],
)
def test_bad_request_exits_2_naming_the_field(change: dict[str, Any], message: str) -> None:
    request = {
        "run": "r",
        "me": "kimi-h1",
        "address": "127.0.0.2",
        "port": 29499,
        "listen": [],
        "peers": [],
        "bandwidth": None,
        "deadline_s": 1,
    }
    (outcome,) = run([{**request, **change}])
    assert outcome.rc == 2
    assert outcome.stderr == f"kimi-deploy: comm check: bad request: {message}\n"
    assert outcome.result == {"ok": False, "error": f"bad request: {message}"}


def test_a_peer_sending_deeply_nested_json_is_named_in_one_line() -> None:
    # kimi-h2 is compromised: its check port greets with, and its report to kimi-h1 is, JSON nested
    # far deeper than Python's decoder recurses.
    topo = topology(2)
    me, peer = topo.requests
    hello = b"[" * 4000 + b"\n"
    report = b"[" * 500_000 + b"\n"
    with held(peer["address"], topo.check) as listener:

        def fake_peer() -> None:
            listener.settimeout(DEADLINE)
            sent = False
            until = time.monotonic() + DEADLINE
            while time.monotonic() < until:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(hello)
                if not sent:
                    sent = True
                    with socket.socket() as out:
                        out.bind((peer["address"], 0))
                        out.settimeout(1)
                        for _ in range(20):
                            try:
                                out.connect((me["address"], topo.check))
                                break
                            except ConnectionRefusedError:
                                time.sleep(0.05)
                        out.recv(HELLO_BYTES)
                        out.sendall(report)

        worker = threading.Thread(target=fake_peer, daemon=True)
        worker.start()
        (outcome,) = run([me])
        worker.join(DEADLINE + 1)
    message = "kimi-h2's message: JSON nested deeper than 8 levels"
    assert (outcome.rc, outcome.stderr) == (1, f"kimi-deploy: comm check: {message}\n")
    failures = [f["message"] for f in outcome.result["failures"]]
    assert failures[0] == message
    assert (
        f"kimi-h1 -> kimi-h2:{topo.check} (comm check): answered, but not by this run's comm check "
        "(kimi-h2's hello: JSON nested deeper than 8 levels)"
    ) in failures
    assert outcome.result["reports"]["kimi-h2"]["received"] is True


def _commcheck() -> Any:
    spec = importlib.util.spec_from_file_location("commcheck", HOSTSIDE / "commcheck.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
        (TimeoutError("timed out"), "timed out"),
        (OSError(errno.ETIMEDOUT, "Connection timed out"), "timed out"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "network unreachable"),
        (OSError(errno.EHOSTDOWN, "Host is down"), "host down"),
        (OSError(errno.EPROTO, "Protocol error"), "protocol error"),
    ],
)
def test_connect_errors_are_named_by_cause(exc: OSError, cause: str) -> None:
    # Routes and firewalls that loopback cannot simulate still get the operator's name for the errno.
    assert _commcheck()._cause(exc) == cause


def test_a_peer_failure_text_that_would_break_the_log_line_is_not_taken() -> None:
    # A compromised peer's report is printed by every host: its texts stay on one line, bounded.
    check = _commcheck()
    kind = next(iter(check.RANK))
    good = {
        "kind": kind,
        "host": "kimi-h2",
        "message": "kimi-h2 -> kimi-h1:29500: timed out",
        "peer": None,
        "port": None,
    }
    assert check._valid_failure(good)
    for field, bad in [
        ("message", "timed out\nkimi-deploy: comm check: forged line"),
        ("message", "\x1b[2J cleared the operator's screen"),
        ("message", "x" * (check.FAILURE_TEXT_MAX + 1)),
        ("host", "kimi-h2\r"),
        ("peer", "kimi-h1\u2028"),
    ]:
        assert not check._valid_failure({**good, field: bad}), (field, bad)


def _ephemeral_starts(count: int) -> list[int]:
    """Where hostside/commcheck.py starts looking for a free port of this host's ephemeral range."""
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        low, high = (int(v) for v in f.read().split())
    step = (high - low) // (count + 1)
    return [low + k * step for k in range(1, count + 1)]


def test_every_peer_reaches_ports_of_each_hosts_ephemeral_range() -> None:
    topo = topology(3)
    requests = [{**r, "ephemeral": 2} for r in topo.requests]
    outcomes = run(requests)
    starts = _ephemeral_starts(2)
    listening: dict[str, list[int]] = {}
    for outcome in outcomes:
        assert (outcome.rc, outcome.stderr) == (0, ""), outcome.stderr
        ports = [e["port"] for e in outcome.result["listen"] if e["label"] == "ephemeral range"]
        # the first free port from each of two points spread over the range
        assert len(ports) == 2
        assert all(start <= port < start + 64 for start, port in zip(starts, ports, strict=True))
        listening[outcome.result["host"]] = ports
    for outcome in outcomes:
        reached = {(p["to"], p["port"]) for p in outcome.result["pairs"] if p["label"] == "ephemeral range" and p["ok"]}
        others = [h for h in listening if h != outcome.result["host"]]
        assert reached == {(h, port) for h in others for port in listening[h]}


def _moved(request: dict[str, Any], by: int) -> dict[str, Any]:
    """``request`` with every host's loopback address moved ``by`` (127.0.0.2 -> 127.0.0.12): its
    ports are in no TIME_WAIT another test's connections left on the addresses every test uses."""

    def move(address: str) -> str:
        head, last = address.rsplit(".", 1)
        return f"{head}.{int(last) + by}"

    peers = [{**p, "address": move(p["address"])} for p in request["peers"]]
    return {**request, "address": move(request["address"]), "peers": peers}


def test_an_ephemeral_port_a_client_socket_holds_is_passed_over() -> None:
    topo = topology(2)
    requests = [_moved({**r, "ephemeral": 1}, 10) for r in topo.requests]
    first = _ephemeral_starts(1)[0]
    # kimi-h2's first candidate is bound by some client socket: it listens on the next port instead
    with held(requests[1]["address"], first, listen=False):
        outcomes = run(requests)
    assert [o.rc for o in outcomes] == [0, 0], [o.stderr for o in outcomes]
    h1, h2 = outcomes
    assert [e["port"] for e in h2.result["listen"] if e["label"] == "ephemeral range"] == [first + 1]
    assert pair(h1, "kimi-h2", first + 1)["ok"] is True


@pytest.mark.parametrize(
    ("said", "taken"),
    [
        ([40001, 40002], [40001, 40002]),
        ([40001, 40001], [40001]),
        (["40001"], None),
        ([80], None),
        ([40001.0], None),
        (list(range(40001, 40010)), None),
        ([12345], None),  # the check's own port
        ("40001", None),
    ],
)
def test_a_peers_ephemeral_ports_are_taken_only_as_a_short_list_of_tcp_ports(said: Any, taken: Any) -> None:
    assert _commcheck()._announced({"ephemeral": said}, 12345) == taken
