"""All-reduce across the hosts of one engine instance, with the engine release's torch: one JSON line.

Run on every host of the instance at once, by the engine release's python as the engine user.
Input: one argument, base64 of zlib-compressed JSON (the same but ``me``/``address`` on every host):
  {"run": str, "label": str,                   # the instance, for messages: "demo-sglang/serve#0"
   "me": str, "address": str,                  # this host's name and its address in the topology
   "backend": "nccl" | "gloo",
   "rendezvous": {"address": str, "port": int},  # rank 0's host: a torch.distributed TCPStore
   "hosts": [{"host": str, "address": str, "ranks": int}],  # in rank order, ``me`` among them
   "min_bytes": int, "max_bytes": int,         # sizes double from min to max (max always measured)
   "warmup_iters": int, "iters": int,
   "deadline_s": float,                        # rendezvous, setup and every size together
   "min_busbw_gbs": float,                     # at the largest size
   "env": {str: str}}                          # the topology's environment (NCCL_*, GLOO_* ...)

This host's ranks are forked processes (this launcher never imports torch, so CUDA starts in the
ranks), one per accelerator with NCCL, one with gloo. Each joins the rendezvous, records that it
did, and runs the sizes: fill with rank+1, all-reduce once and count elements that are not the sum
of all ranks, then time ``iters`` all-reduces after ``warmup_iters``. The slowest rank's time counts
(reduced with MAX), as in nccl-tests; algbw = bytes / time, busbw = algbw x 2(n-1)/n (GB = 1e9 B).
``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` name the interface holding ``address`` unless the
topology's environment sets them: traffic goes where the engines' will, and gloo does not offer a
loopback address to its peers.

Output: {"host", "label", "backend", "world", "ok", "seconds", "torch", "nccl", "interface",
"rows": [{"size_bytes", "time_us", "algbw_gbs", "busbw_gbs", "wrong"}], "failure"}. Exit 0 when every
rank finished, no value came back wrong and the bus bandwidth at the largest size reaches
``min_busbw_gbs``; 1 otherwise, with ``kimi-deploy: all-reduce: <failure>`` on stderr; 2 for a bad
request.
"""

from __future__ import annotations

import ipaddress
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from kimi_deploy.hostside import request
from kimi_deploy.hostside.request import read_request

GRACE_S = 15.0  # past the deadline the ranks had to give up by themselves, they are stopped
JOINED = "kimi/joined/"


class BadRequest(request.BadRequest):
    """The request breaks a rule; the message names the field and the rule."""


@dataclass(frozen=True)
class Member:
    host: str
    address: str
    ranks: int
    first_rank: int


@dataclass(frozen=True)
class Request:
    run: str
    label: str
    me: str
    address: str
    backend: str
    rendezvous: tuple[str, int]
    members: tuple[Member, ...]
    min_bytes: int
    max_bytes: int
    warmup_iters: int
    iters: int
    deadline_s: float
    min_busbw_gbs: float
    env: dict[str, str]

    @property
    def world(self) -> int:
        return sum(m.ranks for m in self.members)

    @property
    def mine(self) -> Member:
        return next(m for m in self.members if m.host == self.me)

    def host_of(self, rank: int) -> str:
        return next(m.host for m in self.members if m.first_rank <= rank < m.first_rank + m.ranks)


def _get(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise BadRequest(f"{where}: missing {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise BadRequest(f"{where}.{key}: {value!r} is not of type {getattr(kind, '__name__', 'number')}")
    return value


def _positive(obj: Any, key: str, where: str, zero: bool = False) -> int:
    value: int = _get(obj, key, int, where)
    if value < 0 or (value == 0 and not zero):
        raise BadRequest(f"{where}.{key}: {value} must be {'>= 0' if zero else '> 0'}")
    return value


def _address(obj: Any, key: str, where: str) -> str:
    value = _get(obj, key, str, where)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise BadRequest(f"{where}.{key}: {value!r} is not an IP address") from None


def parse(raw: Any) -> Request:
    """The request, validated; raises BadRequest naming the first bad field."""
    backend = _get(raw, "backend", str, "request")
    if backend not in ("nccl", "gloo"):
        raise BadRequest(f"request.backend: {backend!r} is not nccl or gloo")
    rdzv = _get(raw, "rendezvous", dict, "request")
    port = _positive(rdzv, "port", "rendezvous")
    if port > 65535:
        raise BadRequest(f"rendezvous.port: {port} is not a TCP port (1-65535)")
    members: list[Member] = []
    first = 0
    for i, h in enumerate(_get(raw, "hosts", list, "request")):
        where = f"hosts[{i}]"
        member = Member(_get(h, "host", str, where), _address(h, "address", where), _positive(h, "ranks", where), first)
        if any(m.host == member.host for m in members):
            raise BadRequest(f"{where}.host: {member.host!r} is listed twice")
        members.append(member)
        first += member.ranks
    me = _get(raw, "me", str, "request")
    if not any(m.host == me for m in members):
        raise BadRequest(f"request.me: {me!r} is not among request.hosts")
    low, high = _positive(raw, "min_bytes", "request"), _positive(raw, "max_bytes", "request")
    if low > high or low % 4 or high % 4:
        raise BadRequest(f"request: min_bytes {low} and max_bytes {high} must be multiples of 4, min <= max")
    deadline = float(_get(raw, "deadline_s", (int, float), "request"))
    floor = float(_get(raw, "min_busbw_gbs", (int, float), "request"))
    if deadline <= 0 or floor <= 0:
        raise BadRequest(f"request: deadline_s {deadline:g} and min_busbw_gbs {floor:g} must be > 0")
    env = _get(raw, "env", dict, "request")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise BadRequest("request.env: names and values must be strings")
    return Request(
        run=_get(raw, "run", str, "request"),
        label=_get(raw, "label", str, "request"),
        me=me,
        address=_address(raw, "address", "request"),
        backend=backend,
        rendezvous=(_address(rdzv, "address", "rendezvous"), port),
        members=tuple(members),
        min_bytes=low,
        max_bytes=high,
        warmup_iters=_positive(raw, "warmup_iters", "request", zero=True),
        iters=_positive(raw, "iters", "request"),
        deadline_s=deadline,
        min_busbw_gbs=floor,
        env=dict(env),
    )


def sizes(low: int, high: int) -> list[int]:
    """Doubling from ``low``; ``high`` is always the last size."""
    out = []
    size = low
    while size < high:
        out.append(size)
        size *= 2
    return [*out, high]


def bus_bandwidth(size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for an all-reduce of ``size_bytes`` taking ``seconds`` on ``world`` ranks."""
    algbw = size_bytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world - 1) / world


def format_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def interface_of(address: str) -> str | None:
    """The network interface holding ``address`` (``ip -o addr show to``), None if none is found."""
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)), None)
    if ip is None:
        return None
    prefix = 32 if ipaddress.ip_address(address).version == 4 else 128
    try:
        out = subprocess.run(
            [ip, "-o", "addr", "show", "to", f"{address}/{prefix}"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 1:
            return fields[1].split("@")[0]
    return None


def rank_env(req: Request, interface: str | None) -> dict[str, str]:
    """What the ranks add to their environment: the topology's, and the interface to use."""
    env = dict(req.env)
    if interface is not None:
        for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            env.setdefault(name, interface)
    return env


def verdict(req: Request, rows: list[dict[str, Any]]) -> str | None:
    """The failure the measured rows show, or None."""
    for row in rows:
        if row["wrong"]:
            return f"{row['wrong']} wrong values in the result at {format_bytes(row['size_bytes'])}"
    last = rows[-1]
    if last["busbw_gbs"] < req.min_busbw_gbs:
        return (
            f"bus bandwidth {last['busbw_gbs']:.3g} GB/s at {format_bytes(last['size_bytes'])}, "
            f"needs >= {req.min_busbw_gbs:g} GB/s"
        )
    return None


# --- one rank (a forked process: only here is torch imported) -------------------------------------


class Absent(RuntimeError):
    """Ranks of other hosts never came: the message names them, not the rank that noticed."""


def never_joined(req: Request, missing: list[int]) -> str:
    """``kimi-h4 never joined the rendezvous at ... within 60 s (ranks 8-15)``, host by host."""
    hosts: dict[str, list[int]] = {}
    for rank in missing:
        hosts.setdefault(req.host_of(rank), []).append(rank)
    address, port = req.rendezvous
    parts = []
    for host, ranks in hosts.items():
        span = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
        parts.append(f"{host} (rank{'s' if len(ranks) > 1 else ''} {span})")
    return f"{', '.join(parts)} never joined the rendezvous at {address}:{port} within {req.deadline_s:g} s"


def _rank(req: Request, rank: int, local_rank: int, env: dict[str, str], conn: Connection) -> None:
    os.dup2(2, 1)  # NCCL_DEBUG and library prints go to stderr: stdout carries the result line alone
    os.environ.update(env)
    try:
        conn.send(("done", _measure(req, rank, local_rank, conn)))
    except Absent as exc:
        conn.send(("absent", str(exc)))
    except BaseException as exc:  # noqa: BLE001 - every failure of a rank is reported, not raised
        conn.send(("error", _describe(exc)))
    finally:
        conn.close()
        os._exit(0)  # no atexit handlers of a library in a forked child


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _store(dist: Any, address: str, port: int, world: int, *, master: bool, timeout: timedelta) -> Any:
    """The rendezvous store; rank 0's listens on ``address`` alone (torch would take every interface)."""
    if not master:
        return dist.TCPStore(address, port, world, False, timeout=timeout, wait_for_workers=False)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(1024)
    store = dist.TCPStore(
        address, port, world, True, timeout=timeout, wait_for_workers=False, master_listen_fd=listener.fileno()
    )
    _keep.append(listener)
    return store


_keep: list[socket.socket] = []  # the rendezvous listener lives as long as the rank


def _measure(req: Request, rank: int, local_rank: int, conn: Connection) -> dict[str, Any]:
    conn.send(("step", "importing torch"))
    try:
        import torch  # noqa: PLC0415 - only in the rank: CUDA must start after the fork
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError as exc:
        raise RuntimeError(f"the engine release has no torch ({exc})") from None

    world = req.world
    timeout = timedelta(seconds=req.deadline_s)
    device = torch.device("cpu")
    if req.backend == "nccl":
        found = torch.cuda.device_count()
        if found < req.mine.ranks:
            raise RuntimeError(f"torch sees {found} CUDA devices, the instance uses {req.mine.ranks} on this host")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    conn.send(("step", f"joining the rendezvous at {req.rendezvous[0]}:{req.rendezvous[1]}"))
    address, port = req.rendezvous
    try:
        store = _store(dist, address, port, world, master=rank == 0, timeout=timeout)
    except OSError as exc:
        if rank != 0:
            raise RuntimeError(f"cannot reach the rendezvous at {address}:{port}: {_describe(exc)}") from None
        raise RuntimeError(f"cannot listen on {address}:{port} for the rendezvous: {_describe(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - torch raises several kinds; the message says which
        raise RuntimeError(
            f"cannot reach the rendezvous at {address}:{port} ({req.host_of(0)}) within {req.deadline_s:g} s: "
            f"{_describe(exc)}"
        ) from None
    store.set(f"{JOINED}{rank}", req.me)
    conn.send(("step", "setting up the process group"))
    try:
        dist.init_process_group(req.backend, store=store, rank=rank, world_size=world, timeout=timeout)
    except Exception as exc:
        missing = [r for r in range(world) if not store.check([f"{JOINED}{r}"])]
        if missing:
            raise Absent(never_joined(req, missing)) from exc
        raise
    expected = world * (world + 1) / 2
    buf = torch.empty(req.max_bytes // 4, dtype=torch.float32, device=device)
    rows = []
    for size in sizes(req.min_bytes, req.max_bytes):
        conn.send(("step", f"all-reduce of {format_bytes(size)}"))
        t = buf[: size // 4]
        t.fill_(float(rank + 1))
        dist.all_reduce(t)
        wrong = torch.tensor([int((t != expected).sum().item())], dtype=torch.int64, device=device)
        t.zero_()
        for _ in range(req.warmup_iters):
            dist.all_reduce(t)
        dist.all_reduce(torch.zeros(1, device=device))  # every rank starts the clock together
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(req.iters):
            dist.all_reduce(t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        took = torch.tensor([(time.perf_counter() - started) / req.iters], dtype=torch.float64, device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        dist.all_reduce(wrong)
        seconds = float(took.item())
        algbw, busbw = bus_bandwidth(size, seconds, world)
        rows.append(
            {
                "size_bytes": size,
                "time_us": round(seconds * 1e6, 2),
                "algbw_gbs": round(algbw, 3),
                "busbw_gbs": round(busbw, 3),
                "wrong": int(wrong.item()),
            }
        )
    nccl = None
    if req.backend == "nccl":
        version = torch.cuda.nccl.version()
        nccl = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    dist.destroy_process_group()
    return {"rows": rows, "torch": str(torch.__version__), "nccl": nccl}


# --- this host's launcher ----------------------------------------------------------------------------


def run(req: Request) -> dict[str, Any]:
    started = time.monotonic()
    interface = interface_of(req.address)
    env = rank_env(req, interface)
    mine = req.mine
    ctx = multiprocessing.get_context("fork")
    procs: dict[int, tuple[Any, Connection]] = {}
    for local in range(mine.ranks):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_rank, args=(req, mine.first_rank + local, local, env, send), daemon=True)
        proc.start()
        send.close()
        procs[mine.first_rank + local] = (proc, receive)
    steps = dict.fromkeys(procs, "starting")
    done: dict[int, tuple[str, Any]] = {}
    stop_at = started + req.deadline_s + GRACE_S
    open_conns: dict[Any, int] = {conn: rank for rank, (_, conn) in procs.items()}
    while open_conns and time.monotonic() < stop_at:
        for ready in wait(list(open_conns), timeout=max(0.0, stop_at - time.monotonic())):
            rank = open_conns[ready]
            assert isinstance(ready, Connection)
            try:
                kind, value = ready.recv()
            except EOFError:
                del open_conns[ready]
                done.setdefault(rank, ("error", f"exited while {steps[rank]}"))
                continue
            if kind == "step":
                steps[rank] = str(value)
            else:
                done[rank] = (str(kind), value)
    for proc, _ in procs.values():
        if proc.is_alive():
            proc.kill()
        proc.join(5)
    where = f"{req.label} on {', '.join(m.host for m in req.members)} ({req.world} ranks, {req.backend})"
    result: dict[str, Any] = {
        "host": req.me,
        "label": req.label,
        "backend": req.backend,
        "world": req.world,
        "interface": interface,
        "torch": None,
        "nccl": None,
        "rows": [],
    }
    failure = None
    for rank in sorted(procs):
        if rank not in done:
            failure = f"rank {rank} ({req.me}) did not finish within {req.deadline_s:g} s, stopped while {steps[rank]}"
            break
        kind, value = done[rank]
        if kind == "absent":
            failure = str(value)
            break
        if kind == "error":
            failure = f"rank {rank} ({req.me}): {value}"
            break
    if failure is None:
        first = done[min(procs)][1]
        result.update(first)
        failure = verdict(req, first["rows"])
    result["ok"] = failure is None
    result["failure"] = None if failure is None else f"{where}: {failure}"
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def main() -> None:
    try:
        req = parse(read_request())
    except ValueError as exc:
        reason = str(exc) if isinstance(exc, request.BadRequest) else f"cannot decode the request: {exc}"
        print(json.dumps({"ok": False, "error": f"bad request: {reason}"}))
        print(f"kimi-deploy: all-reduce: bad request: {reason}", file=sys.stderr)
        sys.exit(2)
    result = run(req)
    print(json.dumps(result, sort_keys=True))
    if not result["ok"]:
        print(f"kimi-deploy: all-reduce: {result['failure']}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
