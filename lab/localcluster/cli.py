"""``kimi-deploy cluster up|status|down`` (also ``python -m localcluster``): the local test cluster.

``up`` converges: it makes what is missing, keeps what runs, and drops hosts that are no longer
asked for. ``down`` removes everything ``up`` made except the caches (base image, built content)
and the SSH key. Both may be repeated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from localcluster import hosts, image, kernel_limits, log, network, services
from localcluster.hardware_spec import parse_spec
from localcluster.state import (
    MAX_HOSTS,
    ClusterError,
    ClusterState,
    HostRecord,
    Settings,
    load,
    locked,
    save,
    write_atomic,
)

DEFAULT_HOSTS = 4
DEFAULT_HARDWARE = "b300x8"
READY_TIMEOUT_S = 120.0
HARDWARE_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")


def hardware_plan(count: int | None, specs: Sequence[str] | None) -> list[str]:
    """One hardware spec per host: one spec applies to every host, several give one per host."""
    flat = [s.strip() for arg in specs or () for s in arg.split(",") if s.strip()]
    for spec in flat:
        if not HARDWARE_RE.fullmatch(spec):
            raise ClusterError(f"--hardware {spec!r}: a spec is lowercase letters, digits, '.', '_', '-'")
    if len(flat) > 1:
        if count is not None and count != len(flat):
            raise ClusterError(f"--hosts {count} with {len(flat)} --hardware specs: give one spec or one per host")
        count = len(flat)
    count = DEFAULT_HOSTS if count is None else count
    if not 1 <= count <= MAX_HOSTS:
        raise ClusterError(f"--hosts {count}: must be between 1 and {MAX_HOSTS}")
    return flat if len(flat) == count else [flat[0] if flat else DEFAULT_HARDWARE] * count


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise ClusterError(f"cluster {what}: needs root (network namespaces, mounts, cgroups)")


def _planned(settings: Settings, hardware: list[str]) -> list[HostRecord]:
    return [
        HostRecord(
            name=settings.host_name(i),
            address=settings.host_address(i),
            pid=None,
            root=str(hosts.merged_dir(settings, settings.host_name(i))),
            hardware=spec,
            state="creating",
        )
        for i, spec in enumerate(hardware, start=1)
    ]


def up(settings: Settings, hardware: list[str], with_services: bool = True) -> ClusterState:
    """Bring the cluster to ``len(hardware)`` running hosts (and the services) and return its state."""
    _need_root("up")
    started = time.monotonic()
    early = ThreadPoolExecutor(max_workers=1)
    with locked(settings), contextlib.ExitStack() as stack:
        stack.callback(early.shutdown)
        # What the services download (PyPI's wheels, into the cache) comes in while the base image
        # is made; done, its thread ended, before any host is launched (a fork copies only the
        # forking thread).
        fetched = early.submit(services.prefetch) if with_services else None
        image.ensure_tools()
        bases = {o: image.ensure_base(settings, o) for o in sorted({parse_spec(h).os for h in hardware})}
        hosts.ensure_ssh_key(settings)
        hosts.ensure_api_key(settings)
        state = load(settings) or ClusterState.empty(settings)
        wanted = _planned(settings, hardware)
        asked = {h.name: h for h in wanted}

        # A host is reused only as it was asked for: same hardware, same base image.
        def outdated(old: HostRecord) -> bool:
            new = asked.get(old.name)
            made_on = hosts.base_of(settings, old.name)
            if new is None or new.hardware != old.hardware:
                return True
            return made_on not in (None, str(bases[parse_spec(new.hardware).os]))

        dropped = [h for h in state.hosts if outdated(h)]
        if dropped:
            log.info("hosts: removing %s (no longer asked for as they are)", ", ".join(h.name for h in dropped))
            hosts.stop(settings, dropped)
            for host in dropped:
                hosts.destroy(settings, host)
        for old in state.hosts:
            if old not in dropped and hosts.is_running(old):
                asked[old.name].pid = old.pid
                asked[old.name].state = old.state
        # The machine's shared limits, before anything is made: one that cannot be raised stops here.
        for line in kernel_limits.ensure(sum(1 for h in wanted if not hosts.is_running(h))):
            log.info("%s", line)
        state.hosts = wanted
        # Recorded before anything is made, so that `down` can undo a failed `up`.
        save(settings, state)

        network.ensure_bridge(settings)
        to_boot = [h for h in wanted if not hosts.is_running(h)]

        def make(host: HostRecord) -> None:
            if host in to_boot:
                hosts.end_leftovers(settings, host)
                hosts.prepare(settings, host, bases[parse_spec(host.hardware).os])
            else:
                # A running host keeps its namespace; its link to a remade bridge may need mending.
                network.ensure_host_link(settings, host.name, host.address)

        with ThreadPoolExecutor(max_workers=min(8, len(wanted))) as pool:
            list(pool.map(make, wanted))
        for host in wanted:
            hosts.write_identity(settings, host, wanted)
        known = [line for host in wanted for line in hosts.known_hosts_lines(host)]
        write_atomic(settings.known_hosts, "\n".join(known) + "\n")
        if fetched is not None:
            fetched.result()
        early.shutdown()
        # Launched with no other thread running: launch forks, and a fork copies only this thread.
        for host in to_boot:
            host.pid, host.state = hosts.launch(settings, host), "starting"
        save(settings, state)

        errors = _boot_and_serve(settings, state, with_services)
        save(settings, state)
        if errors:
            for extra in errors[1:]:
                log.error("%s", extra)
            raise errors[0]
    booted = f"{len(to_boot)} booted" if to_boot else "all already running"
    log.info("cluster up: %d hosts running (%s) in %.1f s", len(wanted), booted, time.monotonic() - started)
    return state


def _boot_and_serve(settings: Settings, state: ClusterState, with_services: bool) -> list[ClusterError]:
    """Wait for every host to finish booting while the services start; collect what failed."""
    errors: list[ClusterError] = []
    with ThreadPoolExecutor(max_workers=len(state.hosts) + 1) as pool:
        serving = pool.submit(services.ensure, settings, state.services) if with_services else None
        booting = [(h, pool.submit(hosts.wait_ready, settings, h, READY_TIMEOUT_S)) for h in state.hosts]
        for host, future in booting:
            try:
                failed = future.result()
            except ClusterError as exc:
                errors.append(exc)
                continue
            host.state = "running"
            if failed:
                log.warning("%s: degraded, failed units: %s", host.name, " ".join(failed))
        if serving is not None:
            try:
                serving.result()
            except ClusterError as exc:
                errors.append(exc)
    if not with_services and state.services:
        services.stop(settings, state.services)
        state.services.clear()
    return errors


def down(settings: Settings) -> None:
    """Stop and remove everything the recorded cluster made; nothing recorded is nothing to do."""
    _need_root("down")
    started = time.monotonic()
    with locked(settings):
        state = load(settings)
        if state is None:
            log.info("cluster down: no cluster recorded in %s", settings.state_dir)
            return
        services.stop(settings, state.services)
        hosts.stop(settings, state.hosts)
        for host in state.hosts:
            hosts.destroy(settings, host)
        hosts.prune_cgroup_parents(settings)
        with contextlib.suppress(FileNotFoundError):
            (settings.state_dir / "hosts").rmdir()
        network.delete_bridge(settings)
        settings.known_hosts.unlink(missing_ok=True)
        settings.state_file.unlink()
    log.info("cluster down: %d hosts removed in %.1f s", len(state.hosts), time.monotonic() - started)


def status(settings: Settings) -> tuple[ClusterState | None, bool]:
    """The recorded cluster with each host's state checked now, and whether all of it runs."""
    state = load(settings)
    if state is None:
        return None, False
    for host in state.hosts:
        if not hosts.is_running(host):
            host.state = "stopped"
    known = {s.name: s for s in services.SERVICES}
    services_ok = all(
        name in known and services.is_running(settings, known[name], record.pid)
        for name, record in state.services.items()
    )
    healthy = bool(state.hosts) and all(h.state == "running" for h in state.hosts) and services_ok
    return state, healthy


def _print_status(settings: Settings, state: ClusterState, healthy: bool) -> None:
    print(f"cluster {state.bridge} {state.subnet} in {settings.state_dir}: {'up' if healthy else 'NOT healthy'}")
    print(f"{'NAME':<10} {'ADDRESS':<15} {'PID':>8}  {'HARDWARE':<10} STATE")
    for h in state.hosts:
        print(f"{h.name:<10} {h.address:<15} {h.pid or '-':>8}  {h.hardware:<10} {h.state}")
    known = {s.name: s for s in services.SERVICES}
    width = max([32, *(len(record.url) for record in state.services.values())])
    for name, record in state.services.items():
        alive = name in known and services.is_running(settings, known[name], record.pid)
        print(f"service {name:<8} {record.url:<{width}} pid {record.pid:<8} {'running' if alive else 'stopped'}")
    if state.hosts:
        first = state.hosts[0].address
        print(f"ssh: ssh -i {state.ssh_key} -o UserKnownHostsFile={state.known_hosts} root@{first}")


def build_parser(prog: str = "python -m localcluster") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="A local test cluster of real hosts: systemd-nspawn, own IP, real SSH."
    )
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("up", help="create or complete the cluster, wait until every host has booted")
    start.add_argument("--hosts", type=int, help=f"number of hosts (default {DEFAULT_HOSTS})")
    start.add_argument(
        "--hardware",
        nargs="+",
        action="extend",
        metavar="SPEC",
        help=f"hardware per host (b300x8, h200x8, gb300x4, tpu7x4, none; '-smalldisk' after it: a small weights "
        f"disk; '-ubuntu24.04' last: Ubuntu 24.04 instead of Debian 12; comma or space separated; default "
        f"{DEFAULT_HARDWARE})",
    )
    start.add_argument(
        "--no-services", action="store_true", help="hosts only: no fake Hub, no package index, no apt repository"
    )
    show = sub.add_parser("status", help="show the recorded cluster; exit 0 only when all of it runs")
    show.add_argument("--json", action="store_true", help="print state.json with each host's state as now")
    sub.add_parser("down", help="stop and remove the cluster (keeps the cached base image)")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m localcluster") -> int:
    args = build_parser(prog).parse_args(argv)
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("kimi-cluster: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        settings = Settings.from_env()
        if args.action == "up":
            state = up(settings, hardware_plan(args.hosts, args.hardware), with_services=not args.no_services)
            _print_status(settings, state, healthy=True)
            return 0
        if args.action == "down":
            down(settings)
            return 0
        found, healthy = status(settings)
        if found is None:
            print(f"no cluster recorded in {settings.state_dir}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(found.to_json(), indent=2))
        else:
            _print_status(settings, found, healthy)
        return 0 if healthy else 1
    except ClusterError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        if exc.detail:
            print(exc.detail, file=sys.stderr)
        return 2
