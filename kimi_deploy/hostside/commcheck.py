"""Cross-host communication check, run on every host of a topology at once: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON (the same ``run``, ``port``, ``bandwidth`` and
``deadline_s`` on every host):
  {"run": str,                          # the run's id, shared by all hosts (public: no secret)
   "me": str, "address": str,           # this host's name and the address its peers know it by
   "port": int,                         # the check's own port on every host: hello, bandwidth, reports
   "listen": [{"port": int, "label": str}],                  # ports this host must accept on
   "peers": [{"host": str, "address": str,                   # EVERY other host of the topology,
              "ports": [{"port": int, "label": str}]}],      # with the ports this host must reach
   "bandwidth": {"bytes": int, "min_mbit_s": float, "max_s": float} | null,
   "deadline_s": float,
   "phase": "all" | "listen" | "probe" | "verdict",   # default "all"
   "lifetime_s": float,                                # how long a listener may live (listen)
   "ephemeral": int}                                   # ports of the ephemeral range, default 0

The check's token, shared by every host of the run and by no one else, is never in argv (every
local user reads argv in /proc): the listener reads it from the credential ``kimi-commcheck-token``
that systemd gives it (``LoadCredential=``), the other phases from the first line of their
standard input. It never travels either: a listener's hello carries a fresh nonce and an HMAC of it
under the token, and every message a proof over the nonce of the hello it answers, so whoever
connects learns nothing that lets it forge a report, and a port answered without the proof is not
this run's check.

Each host listens on ``port`` and every ``listen`` port of ``address`` only, answers only the peers'
addresses, connects to every peer port (retrying until the probe cutoff, as peers start their
listeners at slightly different times), measures the bandwidth to each peer over ``port`` if asked,
then sends its result to every peer and waits, until ``deadline_s``, for every peer's. A listen port
already taken by a process that accepts connections (the serving engine) is noted, not failed.

The ephemeral range. NCCL, Gloo, UCX and the engines' own sockets also listen on ports the kernel
picks from ``net.ipv4.ip_local_port_range`` when they start, which no plan can name: a firewall
that lets the plan's ports through and drops the rest passes a check of the plan's ports alone and
fails at start. So each host also listens on ``ephemeral`` ports spread over its own range (the
first free one from each of as many evenly spaced points) and names them in its hello; every peer
reaches them, as it reaches the plan's, labelled ``ephemeral range``.

Phases. ``all`` does everything in one process, so every host must start it within the probes'
window of the others. A converge driving many hosts cannot promise that, so it takes the check in
three steps, each on every host of the topology before the next starts anywhere (pyinfra's
operations are barriers): ``listen`` (a transient ``Type=notify`` service: it listens, answers the
peers and keeps the reports they send, for at most ``lifetime_s``), ``probe`` (reaches every peer
port, measures the bandwidth, then sends its report to every peer's listener and its own: they all
listen already, whenever this host's turn came) and ``verdict`` (reads what its own listener
gathered, every peer having probed by then, and decides). No step waits on another host's start.

Output: {"host", "address", "ok", "seconds", "listen": [...], "rejected": [address],
"pairs": [...], "reports": {peer: {...}}, "failures": [...]}. Exit 0 only if every pair in both
directions passed, every peer reported and received this host's report; 1 otherwise, with
``kimi-deploy: comm check: <first failure>`` on stderr (every host names the same first failure
when the reports got through); 2 for a malformed request.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import io
import ipaddress
import json
import os
import secrets
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from kimi_deploy.hostside import request
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_text import control_char
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.sd_notify import notify

CHECK_LABEL = "comm check"
# The credential systemd gives the listener (LoadCredential=): the check's token.
TOKEN_CREDENTIAL = "kimi-commcheck-token"  # noqa: S105 - a name, not the token
TOKEN_MAX = 256
NONCE_MAX = 64
PROTOCOL = 1
ATTEMPT_S = 1.0  # one connect attempt; a firewall that drops SYNs shows as "timed out"
RETRY_S = 0.1
HELLO_S = 0.5  # a comm check listener says hello at once; a live service says nothing
HELLO_MAX = 4096
LINE_MAX = 1 << 20  # a report line
MESSAGE_DEPTH = 8  # a report nests 3 deep (message, failures, failure)
REPORT_FAILURES_MAX = 200
# A peer's failure texts are printed: one line each, of a bounded length.
FAILURE_TEXT_MAX = 1000
REJECTED_MAX = 20
CHUNK = 1 << 18
EPHEMERAL_LABEL = "ephemeral range"
EPHEMERAL_MAX = 8
# Where Linux keeps the range, and its default when it cannot be read (ip-sysctl.rst).
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_PORT_RANGE = (32768, 60999)
# How far past each spaced point a host looks for a free port of its range.
EPHEMERAL_TRIES = 64

# Ordered so that every host names a root cause first: a host's own setup (its address, its ports),
# a host that never ran, then links, then what follows from lost reports.
PHASES = ("all", "listen", "probe", "verdict")
LIFETIME_MAX_S = 3600.0
COLLECT_S = 10.0  # the verdict's read of its own listener, on the host itself
RANK = {"local": 0, "down": 1, "connect": 2, "bandwidth": 3, "silent": 4, "undelivered": 5}

_CAUSES = {
    errno.ECONNREFUSED: "connection refused",
    errno.ETIMEDOUT: "timed out",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTDOWN: "host down",
    errno.ECONNRESET: "connection reset",
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "address not available on this host",
    errno.EACCES: "permission denied",
}


class BadRequest(request.BadRequest):
    """The request breaks a rule; the message names the field and the rule."""


@dataclass(frozen=True)
class Port:
    port: int
    label: str


@dataclass(frozen=True)
class Peer:
    host: str
    address: str
    ports: tuple[Port, ...]


@dataclass(frozen=True)
class Bandwidth:
    bytes: int
    min_mbit_s: float
    max_s: float


@dataclass(frozen=True)
class Request:
    run: str
    me: str
    address: str
    family: socket.AddressFamily
    port: int
    listen: tuple[Port, ...]
    peers: tuple[Peer, ...]
    bandwidth: Bandwidth | None
    deadline_s: float
    phase: str = "all"
    lifetime_s: float = 900.0
    ephemeral: int = 0


_KINDS = {str: "a string", int: "an integer", list: "a list", (int, float): "a number"}


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise BadRequest(f"{where}: missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadRequest(f"{where}.{key}: {value!r} is not {_KINDS[kind]}")
    return value


def _name(obj: Any, key: str, where: str) -> str:
    value: str = _get(obj, key, str, where)
    if not value.strip():
        raise BadRequest(f"{where}.{key}: must not be empty")
    return value


def _address(obj: Any, key: str, where: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    value = _get(obj, key, str, where)
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise BadRequest(f"{where}.{key}: {value!r} is not an IP address (names are not resolved)") from None


def _port(obj: Any, key: str, where: str) -> int:
    value: int = _get(obj, key, int, where)
    if not 1 <= value <= 65535:
        raise BadRequest(f"{where}.{key}: {value} is not a TCP port (1-65535)")
    return value


def _ports(value: Any, where: str, check_port: int) -> tuple[Port, ...]:
    if not isinstance(value, list):
        raise BadRequest(f"{where}: {value!r} is not a list")
    ports = tuple(
        Port(_port(p, "port", f"{where}[{i}]"), _name(p, "label", f"{where}[{i}]")) for i, p in enumerate(value)
    )
    numbers = [p.port for p in ports]
    for number in numbers:
        if numbers.count(number) > 1:
            raise BadRequest(f"{where}: port {number} is listed twice")
        if number == check_port:
            raise BadRequest(f"{where}: port {number} is the comm check's own port")
    return ports


def parse(raw: Any) -> Request:
    """The request, validated; raises BadRequest naming the first bad field."""
    me = _name(raw, "me", "request")
    own = _address(raw, "address", "request")
    port = _port(raw, "port", "request")
    peers: list[Peer] = []
    peers_raw = _get(raw, "peers", list, "request")
    seen_hosts, seen_addresses = {me}, {own}
    for i, p in enumerate(peers_raw):
        where = f"peers[{i}]"
        host = _name(p, "host", where)
        address = _address(p, "address", where)
        if host in seen_hosts:
            raise BadRequest(f"{where}.host: {host!r} is this host or listed twice")
        if address in seen_addresses:
            raise BadRequest(f"{where}.address: {address} is this host's or listed twice")
        if address.version != own.version:
            raise BadRequest(f"{where}.address: {address} is not IPv{own.version} like request.address")
        seen_hosts.add(host)
        seen_addresses.add(address)
        peers.append(Peer(host, str(address), _ports(_get(p, "ports", list, where), f"{where}.ports", port)))
    bandwidth = None
    bw = raw.get("bandwidth")
    if bw is not None:
        size: int = _get(bw, "bytes", int, "bandwidth")
        floor = float(_get(bw, "min_mbit_s", (int, float), "bandwidth"))
        max_s = float(_get(bw, "max_s", (int, float), "bandwidth"))
        if size <= 0 or floor < 0 or max_s <= 0:
            raise BadRequest(f"bandwidth: bytes and max_s must be > 0 and min_mbit_s >= 0, got {bw!r}")
        bandwidth = Bandwidth(size, floor, max_s)
    deadline = float(_get(raw, "deadline_s", (int, float), "request"))
    if deadline <= 0:
        raise BadRequest(f"request.deadline_s: {deadline:g} must be > 0")
    phase = raw.get("phase", "all")
    if phase not in PHASES:
        raise BadRequest(f"request.phase: {phase!r} is not one of {', '.join(PHASES)}")
    lifetime = float(_get(raw, "lifetime_s", (int, float), "request")) if "lifetime_s" in raw else 900.0
    if not 0 < lifetime <= LIFETIME_MAX_S:
        raise BadRequest(f"request.lifetime_s: {lifetime:g} must be > 0 and <= {LIFETIME_MAX_S:g}")
    ephemeral: int = _get(raw, "ephemeral", int, "request") if "ephemeral" in raw else 0
    if not 0 <= ephemeral <= EPHEMERAL_MAX:
        raise BadRequest(f"request.ephemeral: {ephemeral} must be from 0 to {EPHEMERAL_MAX}")
    return Request(
        run=_get(raw, "run", str, "request"),
        me=me,
        address=str(own),
        family=socket.AF_INET6 if own.version == 6 else socket.AF_INET,
        port=port,
        listen=_ports(_get(raw, "listen", list, "request"), "request.listen", port),
        peers=tuple(peers),
        bandwidth=bandwidth,
        deadline_s=deadline,
        phase=phase,
        lifetime_s=lifetime,
        ephemeral=ephemeral,
    )


def _port_range() -> tuple[int, int]:
    """This host's ephemeral port range (``DEFAULT_PORT_RANGE`` when it cannot be read)."""
    try:
        with open(PORT_RANGE_FILE, encoding="ascii") as f:
            low, high = (int(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        return DEFAULT_PORT_RANGE
    return (low, high) if 1024 <= low < high <= 65535 else DEFAULT_PORT_RANGE


def _announced(hello: dict[str, Any], check_port: int) -> list[int] | None:
    """The ephemeral ports a peer's hello names; None when they are not a short list of TCP ports
    (a peer is outside this host's recipe: what it says is checked before it is used)."""
    ports = hello.get("ephemeral", [])
    if not isinstance(ports, list) or len(ports) > EPHEMERAL_MAX:
        return None
    if not all(type(p) is int and 1024 <= p <= 65535 and p != check_port for p in ports):
        return None
    return list(dict.fromkeys(ports))


def _cause(exc: BaseException) -> str:
    """The operator's name for why a socket call failed."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.errno in _CAUSES:
        return _CAUSES[exc.errno]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def _num(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _failure(kind: str, host: str, peer: str | None, port: int | None, message: str) -> dict[str, Any]:
    return {"kind": kind, "host": host, "peer": peer, "port": port, "message": message}


def _order(failure: dict[str, Any]) -> tuple[int, str, str, int, str]:
    return (
        RANK[failure["kind"]],
        failure["host"],
        failure["peer"] or "",
        failure["port"] or 0,
        failure["message"],
    )


def _text(value: Any) -> bool:
    """A peer's text fit to print on one line of the operator's log."""
    return isinstance(value, str) and len(value) <= FAILURE_TEXT_MAX and control_char(value) is None


def _valid_failure(item: Any) -> bool:
    return (
        isinstance(item, dict)
        and item.get("kind") in RANK
        and _text(item.get("host"))
        and _text(item.get("message"))
        and (item.get("peer") is None or _text(item.get("peer")))
        and (item.get("port") is None or (isinstance(item.get("port"), int) and not isinstance(item["port"], bool)))
    )


def _recv_line(sock: socket.socket, limit: int) -> bytes:
    """One line from a peer that sends nothing after it, or what came before EOF; bounded."""
    data = b""
    while b"\n" not in data:
        chunk = sock.recv(min(4096, limit + 1 - len(data)))
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise ValueError("line too long")
    return data.split(b"\n", 1)[0]


def _line(obj: Any) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def _json_line(line: bytes, where: str) -> dict[str, Any] | None:
    """The JSON object a peer's line holds, None for an empty line or another JSON value;
    ``ValueError`` (one line starting with ``where``) for a line that is not bounded JSON."""
    if not line.strip():
        return None
    obj = loads(line, where, LINE_MAX, MESSAGE_DEPTH)
    return obj if isinstance(obj, dict) else None


def read_token(environ: Mapping[str, str], stdin: TextIO) -> str:
    """The check's token: the credential systemd gave this process (the listener), else the first
    line of ``stdin``. ``BadRequest`` when there is none or it is not one line of ASCII text."""
    folder = environ.get("CREDENTIALS_DIRECTORY")
    where = f"in its credential {TOKEN_CREDENTIAL}" if folder else "on standard input"
    try:
        if folder:
            with open(os.path.join(folder, TOKEN_CREDENTIAL), encoding="ascii") as f:
                token = f.read(TOKEN_MAX + 2).strip()
        else:
            token = stdin.readline(TOKEN_MAX + 2).strip()
    except (OSError, ValueError) as exc:
        raise BadRequest(f"no token {where}: {exc}") from None
    if not token:
        raise BadRequest(f"no token {where}")
    if len(token) > TOKEN_MAX or control_char(token) or not token.isascii():
        raise BadRequest(f"the token {where} is not one line of at most {TOKEN_MAX} ASCII characters")
    return token


class Check:
    """One host's part of the check: listeners, probes, bandwidth, and the exchange of results."""

    def __init__(self, req: Request, token: str) -> None:
        self.req = req
        self.token = token.encode()
        self.start = time.monotonic()
        self.deadline = self.start + req.deadline_s
        # Probes stop early enough for every host's report to reach every other host in time.
        self.cutoff = self.deadline - min(max(1.0, req.deadline_s / 5), req.deadline_s / 2)
        self.peer_at = {p.address: p for p in req.peers}
        # This host itself, as its own listener sees its probe step (phases ``probe``, ``verdict``)
        self.me = Peer(req.me, req.address, ())
        self.probed: dict[str, Any] | None = None
        self.ephemeral: list[int] = []  # this host's listeners in its ephemeral range
        self.cond = threading.Condition()
        self.reports: dict[str, dict[str, Any]] = {}
        self.delivered: dict[str, str | None] = {}  # peer -> None when acknowledged, else why not
        self.listen: list[dict[str, Any]] = []
        self.listening: dict[socket.socket, dict[str, Any]] = {}
        self.rejected: list[str] = []
        self.local: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.greeted: dict[str, dict[str, Any]] = {}  # peer -> the hello of its comm check port

    def _left(self, until: float) -> float:
        return until - time.monotonic()

    # --- listening side -------------------------------------------------------------------------

    def _listener(self, port: int) -> socket.socket:
        """A non-blocking listener on ``port`` of this host's address (raises OSError)."""
        sock = socket.socket(self.req.family, socket.SOCK_STREAM)
        # SO_REUSEADDR only passes sockets in TIME_WAIT; a live listener still makes bind fail.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.req.address, port))
            sock.listen(socket.SOMAXCONN)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    def _entry(self, port: Port) -> dict[str, Any]:
        """``port``'s line of this host's answer (``listen``), listening until told otherwise."""
        entry: dict[str, Any] = {
            "port": port.port,
            "label": port.label,
            "state": "listening",
            "error": None,
            "accepted_from": [],
        }
        self.listen.append(entry)
        return entry

    def _open(self) -> None:
        req = self.req
        for port in (Port(req.port, CHECK_LABEL), *req.listen):
            entry = self._entry(port)
            try:
                sock = self._listener(port.port)
            except OSError as exc:
                where = f"{req.me}: {_hostport(req.address, port.port)} ({port.label})"
                if exc.errno == errno.EADDRINUSE and port.port != req.port:
                    # Whoever holds it (the engine serving now) answers the peers in our stead.
                    entry["state"] = "in use"
                    probe, cause, _ = self._connect(req.address, port.port, time.monotonic() + ATTEMPT_S, once=True)
                    if probe is not None:
                        probe.close()
                    else:
                        entry["error"] = cause
                        self.local.append(
                            _failure(
                                "local",
                                req.me,
                                None,
                                port.port,
                                f"{where}: port in use, but nothing accepts connections on it ({cause})",
                            )
                        )
                else:
                    entry["state"] = "failed"
                    entry["error"] = _cause(exc)
                    self.local.append(
                        _failure("local", req.me, None, port.port, f"{where}: cannot listen: {_cause(exc)}")
                    )
                continue
            self.listening[sock] = entry
        self._open_ephemeral()

    def _proof(self, what: str) -> str:
        """What only a holder of the token can say about ``what``."""
        return hmac.new(self.token, what.encode(), hashlib.sha256).hexdigest()

    def _hello(self) -> tuple[bytes, str]:
        """What this host's listeners say first on a connection (the run, the host, its ports of the
        ephemeral range, a fresh nonce and the proof that this run's check says it), and the nonce:
        the messages that follow on that connection prove the token over it."""
        req = self.req
        nonce = secrets.token_hex(16)
        hello = {
            "kimi_commcheck": PROTOCOL,
            "run": req.run,
            "host": req.me,
            "ephemeral": self.ephemeral,
            "nonce": nonce,
            "proof": self._proof(f"hello {req.me} {nonce}"),
        }
        return _line(hello), nonce

    def _message(self, nonce: str, message: dict[str, Any]) -> bytes:
        """``message`` from this host to the listener whose hello held ``nonce``."""
        proof = self._proof(f"message {self.req.me} {nonce}")
        return _line({"run": self.req.run, "from": self.req.me, **message, "proof": proof})

    def _open_ephemeral(self) -> None:
        """Listeners on ``ephemeral`` ports of this host's range: the first free port from each of
        as many evenly spaced points (a port the kernel gave a client socket is skipped)."""
        req = self.req
        if not req.ephemeral:
            return
        low, high = _port_range()
        taken = {req.port, *(p.port for p in req.listen)}
        step = (high - low) // (req.ephemeral + 1)
        for k in range(1, req.ephemeral + 1):
            start = low + k * step
            for port in range(start, min(high, start + EPHEMERAL_TRIES) + 1):
                if port in taken:
                    continue
                try:
                    sock = self._listener(port)
                except OSError:
                    continue
                taken.add(port)
                self.listening[sock] = self._entry(Port(port, EPHEMERAL_LABEL))
                self.ephemeral.append(port)
                break
        if len(self.ephemeral) < req.ephemeral:
            said = (
                f"{req.me}: cannot listen on {req.ephemeral - len(self.ephemeral)} of the "
                f"{req.ephemeral} ports of its ephemeral range {low}-{high} it looked at"
            )
            self.local.append(_failure("local", req.me, None, None, said))

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            for sock, entry in self.listening.items():
                selector.register(sock, selectors.EVENT_READ, (sock, entry))
            while not self.stop.is_set():
                for key, _ in selector.select(0.05):
                    listener, entry = key.data
                    try:
                        conn, source = listener.accept()
                    except OSError:
                        continue
                    self._accept(conn, source[0], entry)

    def _accept(self, conn: socket.socket, source: str, entry: dict[str, Any]) -> None:
        address = str(ipaddress.ip_address(source.split("%", 1)[0]))
        peer = self.peer_at.get(address)
        if peer is None and address == self.req.address and entry["port"] == self.req.port:
            peer = self.me  # this host's own probe and verdict steps
        if peer is None:
            conn.close()
            with self.cond:
                if source not in self.rejected and len(self.rejected) < REJECTED_MAX:
                    self.rejected.append(source)
            return
        with self.cond:
            if peer is not self.me and peer.host not in entry["accepted_from"]:
                entry["accepted_from"].append(peer.host)
        if entry["port"] == self.req.port:
            threading.Thread(target=self._handle, args=(conn, peer), daemon=True).start()
            return
        with conn:
            try:
                conn.settimeout(HELLO_S)
                conn.sendall(self._hello()[0])
            except OSError:
                pass

    def _handle(self, conn: socket.socket, peer: Peer) -> None:
        """Serves one connection to the check port: a probe, a bandwidth stream or a report."""
        try:
            with conn, conn.makefile("rb") as stream:
                conn.settimeout(max(0.1, self._left(self.deadline)))
                hello, nonce = self._hello()
                conn.sendall(hello)
                line = stream.readline(LINE_MAX)
                if not line:
                    return  # a probe: it connected, read the hello and left
                try:
                    msg = _json_line(line, f"{peer.host}'s message") if line.endswith(b"\n") else None
                except ValueError as exc:
                    self._store_unreadable(peer, str(exc))
                    return
                if msg is None or msg.get("from") != peer.host or not isinstance(msg.get("proof"), str):
                    return
                # Only a holder of the token answers this connection's nonce: anyone else who
                # connected from a peer's address (a local user there) is not listened to.
                if not hmac.compare_digest(msg["proof"], self._proof(f"message {peer.host} {nonce}")):
                    return
                if msg.get("op") == "bandwidth" and self.req.bandwidth is not None:
                    received = self._receive(stream, self.req.bandwidth.bytes)
                    conn.sendall(_line({"received": received}))
                elif msg.get("op") == "report" and peer is not self.me:
                    # Acknowledged before it counts: once the last report counts this process may exit,
                    # and the sender must not be left retrying a host that is gone.
                    conn.sendall(b'{"ok": true}\n')
                    self._store(peer, msg)
                elif msg.get("op") == "probed" and peer is self.me:
                    with self.cond:
                        self.probed = msg
                    conn.sendall(b'{"ok": true}\n')
                elif msg.get("op") == "collect" and peer is self.me:
                    with self.cond:
                        gathered = {
                            "reports": dict(self.reports),
                            "probed": self.probed,
                            "listen": self.listen,
                            "rejected": list(self.rejected),
                            "local": list(self.local),
                        }
                    conn.sendall(_line(gathered))
        except (OSError, ValueError):
            return

    @staticmethod
    def _receive(stream: io.BufferedReader, cap: int) -> int:
        received = 0
        while chunk := stream.read1(CHUNK):
            received += len(chunk)
            if received > cap:
                raise ValueError("more bytes than the request allows")
        return received

    def _store(self, peer: Peer, msg: dict[str, Any]) -> None:
        failures = msg.get("failures")
        kept = [f for f in failures[:REPORT_FAILURES_MAX] if _valid_failure(f)] if isinstance(failures, list) else []
        ok = msg.get("ok") is True and not kept
        if not ok and not kept:
            kept = [_failure("local", peer.host, None, None, f"{peer.host} reported a failure without details")]
        with self.cond:
            self.reports[peer.host] = {
                "ok": ok,
                "failures": kept,
                "seconds": round(time.monotonic() - self.start, 3),
            }
            self.cond.notify_all()

    def _store_unreadable(self, peer: Peer, why: str) -> None:
        """A peer sent what no comm check sends: its report is a failure saying so."""
        with self.cond:
            if peer.host not in self.reports:
                self.reports[peer.host] = {
                    "ok": False,
                    "failures": [_failure("local", peer.host, None, None, why)],
                    "seconds": round(time.monotonic() - self.start, 3),
                }
                self.cond.notify_all()

    # --- connecting side ------------------------------------------------------------------------

    def _connect(
        self, address: str, port: int, until: float, once: bool = False
    ) -> tuple[socket.socket | None, str, int]:
        """A connected socket from this host's address, retried until ``until``; else the last cause."""
        attempts, cause = 0, "timed out"
        while True:
            left = self._left(until)
            if left <= 0:
                return None, cause, attempts
            attempts += 1
            sock = socket.socket(self.req.family, socket.SOCK_STREAM)
            # Else its TIME_WAIT would keep a listener (of a later check, on this address) from binding.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                # The source address is the one peers know this host by, whatever the route.
                sock.bind((self.req.address, 0))
                sock.settimeout(min(ATTEMPT_S, left))
                sock.connect((address, port))
            except OSError as exc:
                sock.close()
                cause = _cause(exc)
                if exc.errno == errno.EADDRNOTAVAIL or once:
                    return None, cause, attempts
                time.sleep(max(0.0, min(RETRY_S, self._left(until))))
                continue
            return sock, "", attempts

    def _proven(self, hello: dict[str, Any] | None) -> str | None:
        """The nonce of a hello this run's check said (its proof holds), else None."""
        if hello is None or hello.get("kimi_commcheck") != PROTOCOL or hello.get("run") != self.req.run:
            return None
        nonce, proof, host = hello.get("nonce"), hello.get("proof"), hello.get("host")
        if not (isinstance(nonce, str) and isinstance(proof, str) and isinstance(host, str)) or len(nonce) > NONCE_MAX:
            return None
        return nonce if hmac.compare_digest(proof, self._proof(f"hello {host} {nonce}")) else None

    def _greet(self, sock: socket.socket, peer: Peer, check: bool) -> tuple[str | None, str | None, str]:
        """Who answered: ("comm check" | "other", None, the hello's nonce), or (None, why that is a
        failure, "")."""
        try:
            sock.settimeout(max(0.05, min(HELLO_S if not check else ATTEMPT_S, self._left(self.deadline))))
            hello = _json_line(_recv_line(sock, HELLO_MAX), f"{peer.host}'s hello")
        except OSError:
            hello = None
        except ValueError as exc:
            if check:
                return None, f"answered, but not by this run's comm check ({exc})", ""
            hello = None
        nonce = self._proven(hello)
        if hello is None or nonce is None:
            if check:
                return None, "answered, but not by this run's comm check (another process holds the port?)", ""
            return "other", None, ""
        if hello.get("host") != peer.host:
            return None, f"answered by {hello.get('host')}'s comm check, not {peer.host}'s (address mix-up?)", ""
        if check:
            with self.cond:
                self.greeted[peer.host] = hello
        return CHECK_LABEL, None, nonce

    def _probe(self, peer: Peer, port: Port, check: bool = False) -> dict[str, Any]:
        started = time.monotonic()
        sock, cause, attempts = self._connect(peer.address, port.port, self.cutoff)
        reached = None
        if sock is not None:
            with sock:
                reached, why, _ = self._greet(sock, peer, check)
            cause = why or ""
        return {
            "kind": "connect",
            "from": self.req.me,
            "to": peer.host,
            "address": peer.address,
            "port": port.port,
            "label": port.label,
            "ok": not cause,
            "cause": cause or None,
            "seconds": round(time.monotonic() - started, 3),
            "attempts": attempts,
            "reached": reached,
        }

    def _unmeasured(self, peer: Peer, bw: Bandwidth, cause: str | None) -> dict[str, Any]:
        return {
            "kind": "bandwidth",
            "from": self.req.me,
            "to": peer.host,
            "address": peer.address,
            "port": self.req.port,
            "label": "bandwidth",
            "ok": False,
            "cause": cause,
            "seconds": 0.0,
            "bytes": 0,
            "mbit_s": None,
            "min_mbit_s": bw.min_mbit_s,
        }

    def _bandwidth(self, peer: Peer, bw: Bandwidth) -> dict[str, Any]:
        result = self._unmeasured(peer, bw, None)
        sock, cause, _ = self._connect(peer.address, self.req.port, self.cutoff)
        if sock is None:
            result["cause"] = cause
            return result
        with sock:
            _, why, nonce = self._greet(sock, peer, check=True)
            if why:
                result["cause"] = why
                return result
            block = memoryview(bytes(CHUNK))
            try:
                sock.sendall(self._message(nonce, {"op": "bandwidth"}))
                started = time.monotonic()
                stop_at = min(started + bw.max_s, self.cutoff)
                sent = 0
                while sent < bw.bytes and self._left(stop_at) > 0:
                    sock.settimeout(max(0.001, self._left(stop_at)))
                    try:
                        sent += sock.send(block[: min(CHUNK, bw.bytes - sent)])
                    except TimeoutError:
                        break
                sock.shutdown(socket.SHUT_WR)
                # Counted from the receiver's acknowledgement, not from what the socket buffer took.
                sock.settimeout(max(0.1, self._left(self.deadline) / 2))
                ack = _json_line(_recv_line(sock, HELLO_MAX), f"{peer.host}'s acknowledgement")
            except (OSError, ValueError) as exc:
                result["cause"] = f"bandwidth test failed: {_cause(exc)}"
                return result
        seconds = max(time.monotonic() - started, 1e-6)
        received = ack.get("received") if ack else None
        if not isinstance(received, int) or isinstance(received, bool):
            result["cause"] = f"bandwidth test failed: no acknowledgement from {peer.host}"
            return result
        rate = received * 8 / seconds / 1e6
        result.update(seconds=round(seconds, 3), bytes=received, mbit_s=round(rate, 1), ok=rate >= bw.min_mbit_s)
        if not result["ok"]:
            result["cause"] = f"{rate:.1f} Mbit/s, needs >= {_num(bw.min_mbit_s)} Mbit/s"
        return result

    def _peer_check(self, peer: Peer) -> list[dict[str, Any]]:
        """The check port of ``peer``, then the bandwidth to it over that port."""
        pair = self._probe(peer, Port(self.req.port, CHECK_LABEL), check=True)
        pairs = [pair]
        if self.req.bandwidth is not None:
            if pair["ok"]:
                pairs.append(self._bandwidth(peer, self.req.bandwidth))
            else:
                pairs.append(
                    self._unmeasured(peer, self.req.bandwidth, "not measured: the comm check port was not reached")
                )
        if pair["ok"]:
            pairs += self._ephemeral_pairs(peer, pair)
        return pairs

    def _ephemeral_pairs(self, peer: Peer, check_pair: dict[str, Any]) -> list[dict[str, Any]]:
        """The ports of its ephemeral range ``peer`` named in its hello, all reached at once."""
        with self.cond:
            hello = self.greeted.get(peer.host, {})
        ports = _announced(hello, self.req.port)
        if ports is None:
            cause = "its hello names ephemeral ports that are not a short list of TCP ports"
            return [{**check_pair, "ok": False, "cause": cause, "label": EPHEMERAL_LABEL}]
        results: list[dict[str, Any]] = [{} for _ in ports]

        def work(i: int, port: int) -> None:
            results[i] = self._probe(peer, Port(port, EPHEMERAL_LABEL))

        threads = [threading.Thread(target=work, args=(i, port), daemon=True) for i, port in enumerate(ports)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def _deliver(self, peer: Peer, report: dict[str, Any]) -> None:
        cause = "timed out"
        while self._left(self.deadline) > 0:
            sock, cause, _ = self._connect(peer.address, self.req.port, self.deadline)
            if sock is None:
                break
            with sock:
                _, why, nonce = self._greet(sock, peer, check=True)
                if why:
                    cause = why
                    break
                try:
                    sock.sendall(self._message(nonce, report))
                    sock.settimeout(max(0.05, self._left(self.deadline)))
                    ack = _json_line(_recv_line(sock, HELLO_MAX), f"{peer.host}'s acknowledgement")
                except (OSError, ValueError) as exc:
                    ack, cause = None, _cause(exc)
            if ack and ack.get("ok") is True:
                with self.cond:
                    self.delivered[peer.host] = None
                    self.cond.notify_all()
                return
            time.sleep(max(0.0, min(RETRY_S, self._left(self.deadline))))
        with self.cond:
            self.delivered[peer.host] = cause
            self.cond.notify_all()

    # --- the whole check ------------------------------------------------------------------------

    def _report(
        self, pairs: list[dict[str, Any]], local: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """This host's failures (its own setup's, then its pairs') and the report that says them."""
        own = [
            _failure(p["kind"], self.req.me, p["to"], p["port"] if p["kind"] == "connect" else None, self._say(p))
            for p in pairs
            if not p["ok"]
        ]
        mine = sorted(local + own, key=_order)
        return mine, {"op": "report", "ok": not mine, "failures": mine[:REPORT_FAILURES_MAX]}

    def _send_all(self, report: dict[str, Any]) -> None:
        """``report`` to every peer at once, each acknowledgement (or why none) in ``delivered``."""
        for peer in self.req.peers:
            threading.Thread(target=self._deliver, args=(peer, report), daemon=True).start()

    def _deliver_all(self, report: dict[str, Any]) -> dict[str, str | None]:
        """``report`` to every peer at once; peer -> None once acknowledged, else why not."""
        self._send_all(report)
        with self.cond:
            self.cond.wait_for(
                lambda: all(p.host in self.delivered for p in self.req.peers),
                timeout=max(0.0, self._left(self.deadline)),
            )
            return {p.host: self.delivered.get(p.host, "timed out") for p in self.req.peers}

    def run(self) -> dict[str, Any]:
        """Phase ``all``: listen, probe and exchange the reports in this one process."""
        req = self.req
        self._open()
        server = threading.Thread(target=self._serve, daemon=True)
        server.start()
        try:
            pairs = self._probe_all()
            mine, report = self._report(pairs, self.local)
            self._send_all(report)
            with self.cond:
                self.cond.wait_for(
                    lambda: len(self.reports) == len(req.peers) and len(self.delivered) == len(req.peers),
                    timeout=max(0.0, self._left(self.deadline)),
                )
                reports = dict(self.reports)
                delivered = dict(self.delivered)
        finally:
            self.stop.set()
            server.join()
            for sock in self.listening:
                sock.close()
        return self._result(pairs, mine, reports, delivered, f" within {_num(req.deadline_s)} s")

    def listen_until_stopped(self) -> dict[str, Any]:
        """Phase ``listen``: the listeners, up until SIGTERM (the verdict step stops the service)
        or ``lifetime_s``, keeping what peers report and what this host's probe step found."""
        self._open()
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        timer = threading.Timer(self.req.lifetime_s, self.stop.set)
        timer.daemon = True
        timer.start()
        notify("READY=1")
        try:
            self._serve()
        finally:
            for sock in self.listening:
                sock.close()
        return {"host": self.req.me, "listen": self.listen, "rejected": self.rejected, "reports": sorted(self.reports)}

    def _ask_own(self, message: dict[str, Any]) -> dict[str, Any]:
        """This host's own listener's answer to ``message`` (raises OSError or ValueError)."""
        sock, cause, _ = self._connect(self.req.address, self.req.port, time.monotonic() + COLLECT_S, once=True)
        if sock is None:
            raise OSError(cause)
        with sock:
            _, why, nonce = self._greet(sock, self.me, check=True)
            if why:
                raise OSError(why)
            sock.sendall(self._message(nonce, message))
            sock.settimeout(COLLECT_S)
            answer = _json_line(_recv_line(sock, LINE_MAX), f"{self.req.me}'s own listener")
        if answer is None:
            raise ValueError(f"{self.req.me}'s own listener gave no answer")
        return answer

    def _listener_down(self, exc: Exception) -> dict[str, Any]:
        where = f"{self.req.me}: {_hostport(self.req.address, self.req.port)} ({CHECK_LABEL})"
        said = f"{where}: its listener is not running ({_cause(exc)})"
        return _failure("local", self.req.me, None, self.req.port, said)

    def probe_step(self) -> dict[str, Any]:
        """Phase ``probe``: every listener of the topology is up. Probe every peer, send the report
        to every peer and what was found to this host's own listener, for its verdict."""
        try:
            local = [f for f in self._ask_own({"op": "collect"}).get("local") or [] if _valid_failure(f)]
        except (OSError, ValueError) as exc:
            local = [self._listener_down(exc)]
        pairs = self._probe_all()
        mine, report = self._report(pairs, local)
        delivered = self._deliver_all(report)
        found = {"op": "probed", "pairs": pairs, "failures": mine, "delivered": delivered}
        with contextlib.suppress(OSError, ValueError):
            self._ask_own(found)
        return {"host": self.req.me, "ok": not mine, "pairs": pairs, "delivered": delivered}

    def verdict(self) -> dict[str, Any]:
        """Phase ``verdict``: every host of the topology has probed; decide from what this host's
        listener gathered (the peers' reports) and what its probe step found."""
        try:
            gathered = self._ask_own({"op": "collect"})
        except (OSError, ValueError) as exc:
            gathered = {"local": [self._listener_down(exc)]}
        probed = gathered.get("probed") if isinstance(gathered.get("probed"), dict) else None
        local = [f for f in gathered.get("local") or [] if _valid_failure(f)]
        delivered: dict[str, Any] = {}
        if probed is None:
            pairs = []
            mine = local or [_failure("local", self.req.me, None, None, f"{self.req.me}: its probe step did not run")]
        else:
            pairs = [p for p in probed.get("pairs") or [] if isinstance(p, dict)]
            mine = [f for f in probed.get("failures") or [] if _valid_failure(f)]
            delivered = probed["delivered"] if isinstance(probed.get("delivered"), dict) else {}
        reports: dict[str, Any] = gathered["reports"] if isinstance(gathered.get("reports"), dict) else {}
        self.listen = [e for e in gathered.get("listen") or [] if isinstance(e, dict)]
        self.rejected = [a for a in gathered.get("rejected") or [] if isinstance(a, str)]
        return self._result(pairs, mine, reports, delivered, "")

    def _result(
        self,
        pairs: list[dict[str, Any]],
        mine: list[dict[str, Any]],
        reports: dict[str, Any],
        delivered: dict[str, Any],
        within: str,
    ) -> dict[str, Any]:
        """The check's outcome on this host: its own failures, its peers' and whose is missing."""
        req = self.req
        for entry in self.listen:
            entry.get("accepted_from", []).sort()
        check_cause = {
            p.get("to"): p.get("cause") for p in pairs if p.get("kind") == "connect" and p.get("label") == CHECK_LABEL
        }
        failures = list(mine)
        for peer in req.peers:
            got = reports.get(peer.host)
            if isinstance(got, dict):
                failures += got["failures"]
            elif check_cause.get(peer.host):
                failures.append(
                    _failure(
                        "down",
                        peer.host,
                        None,
                        None,
                        f"{peer.host} did not report{within} "
                        f"(host down? its comm check port {req.port}: {check_cause[peer.host]})",
                    )
                )
            else:
                failures.append(
                    _failure(
                        "silent",
                        peer.host,
                        req.me,
                        None,
                        f"{peer.host} did not report{within} (it is up; can it reach {req.me}:{req.port}?)",
                    )
                )
            if delivered.get(peer.host, "timed out") is not None:
                failures.append(
                    _failure(
                        "undelivered",
                        req.me,
                        peer.host,
                        None,
                        f"{req.me} could not deliver its result to {peer.host} within {_num(req.deadline_s)} s "
                        f"({delivered.get(peer.host, 'timed out')})",
                    )
                )
        unique = {f["message"]: f for f in failures}
        failures = sorted(unique.values(), key=_order)
        return {
            "host": req.me,
            "address": req.address,
            "ok": not failures,
            "seconds": round(time.monotonic() - self.start, 3),
            "listen": self.listen,
            "rejected": self.rejected,
            "pairs": pairs,
            "reports": {
                p.host: {
                    "received": p.host in reports,
                    "ok": reports[p.host]["ok"] if p.host in reports else None,
                    "seconds": reports[p.host]["seconds"] if p.host in reports else None,
                    "delivered": delivered.get(p.host, "timed out") is None,
                }
                for p in req.peers
            },
            "failures": failures,
        }

    def _probe_all(self) -> list[dict[str, Any]]:
        """Every pair from this host, all at once: the run takes the slowest probe, not the sum."""
        jobs: list[tuple[Peer, Port | None]] = []
        for peer in self.req.peers:
            jobs += [(peer, port) for port in peer.ports]
            jobs.append((peer, None))
        results: list[list[dict[str, Any]]] = [[] for _ in jobs]

        def work(i: int, peer: Peer, port: Port | None) -> None:
            results[i] = [self._probe(peer, port)] if port is not None else self._peer_check(peer)

        threads = [threading.Thread(target=work, args=(i, *job), daemon=True) for i, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [pair for result in results for pair in result]

    @staticmethod
    def _say(pair: dict[str, Any]) -> str:
        if pair["kind"] == "bandwidth":
            return f"{pair['from']} -> {pair['to']}: {pair['cause']}"
        return f"{pair['from']} -> {pair['to']}:{pair['port']} ({pair['label']}): {pair['cause']}"


def main() -> None:
    try:
        req = parse(read_request())
        token = read_token(os.environ, sys.stdin)
    except ValueError as exc:
        reason = str(exc) if isinstance(exc, request.BadRequest) else f"cannot decode the request: {exc}"
        print(json.dumps({"ok": False, "error": f"bad request: {reason}"}))
        print(f"kimi-deploy: comm check: bad request: {reason}", file=sys.stderr)
        sys.exit(2)
    check = Check(req, token)
    if req.phase in ("listen", "probe"):
        print(json.dumps(check.listen_until_stopped() if req.phase == "listen" else check.probe_step(), sort_keys=True))
        return
    result = check.verdict() if req.phase == "verdict" else check.run()
    print(json.dumps(result, sort_keys=True))
    if not result["ok"]:
        print(f"kimi-deploy: comm check: {result['failures'][0]['message']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
