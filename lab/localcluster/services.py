"""Daemons the cluster serves its hosts from the bridge's gateway address (fake Hub, package index,
apt repositories: NVIDIA's stand-in and the Debian mirror).

Each is ``python -m MODULE --bind GATEWAY --port PORT --root <state>/NAME``, run detached in its
own session with output in ``<state>/logs/NAME.log``. A new service is one more ``Service`` entry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from localcluster import CHECKOUT, hook, launch_detached, log, process_argv
from localcluster.debian_sources import APT_PORT, APT_SERVICE
from localcluster.hosts import log_tail
from localcluster.state import ClusterError, ServiceRecord, Settings

READY_TIMEOUT_S = 20.0
PACKAGE_PARENT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class Service:
    name: str
    module: str
    port: int
    # Appended to http://GATEWAY:PORT for the URL recorded in state.json.
    path: str = ""
    # "module:function" called with the service's root directory before it starts (builds content).
    prepare: str | None = None
    # Also hand ``prepare`` the service's URL, for content that names where it is served from.
    prepare_with_url: bool = False
    # "module:function" fetching what ``prepare`` needs from outside into the cluster's cache, run
    # by ``cluster up`` beside the work that comes before the services (the hosts' base image)
    prefetch: str | None = None


SERVICES = (
    Service("hub", "localcluster.hub", 8765, prepare="localcluster.hub_content:build"),
    Service(
        "index",
        "localcluster.pkgindex",
        8766,
        path="/simple",
        prepare="localcluster.index_content:build",
        prefetch="localcluster.index_content:download",
    ),
    # NVIDIA's stand-in repository at the recorded URL, the Debian mirror at /debian beside it.
    Service(
        APT_SERVICE,
        "localcluster.static_files",
        APT_PORT,
        path="/compute/cuda/repos",
        prepare="localcluster.apt_content:build",
        prepare_with_url=True,
    ),
)

# Started services stay referenced so that Python never warns about, or reaps, a running child.
_started: list[subprocess.Popen[bytes]] = []


def _run_hook(service: Service, spec: str | None, *args: object) -> None:
    """Call the service's "module:function" ``spec`` (a ``prefetch`` or ``prepare``), timed."""
    if spec is None:
        return
    module, _, function = spec.partition(":")
    call = hook(module, function)
    if call is not None:
        started = time.monotonic()
        call(*args)
        log.info("service %s: %s took %.1f s", service.name, spec, time.monotonic() - started)


def prefetch() -> None:
    """Every service's ``prefetch``: downloads into the cache, nothing started."""
    for service in SERVICES:
        _run_hook(service, service.prefetch)


def root_dir(settings: Settings, service: Service) -> Path:
    return settings.state_dir / service.name


def log_file(settings: Settings, service: Service) -> Path:
    return settings.logs_dir / f"{service.name}.log"


def argv(settings: Settings, service: Service) -> list[str]:
    return [
        sys.executable,
        "-m",
        service.module,
        "--bind",
        settings.gateway,
        "--port",
        str(service.port),
        "--root",
        str(root_dir(settings, service)),
    ]


def url(settings: Settings, service: Service) -> str:
    return f"http://{settings.gateway}:{service.port}{service.path}"


def is_running(settings: Settings, service: Service, pid: int) -> bool:
    """``pid`` is alive and is still this cluster's service (not a PID the kernel has since reused)."""
    args = process_argv(pid)
    if not args:
        return False
    # The interpreter's path may differ (another checkout's venv); the rest names this service here.
    return args[1:] == argv(settings, service)[1:]


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


# What the services' content is built from: this checkout's code, its catalogs and recipes (a
# recipe's pins name the real packages the index serves), and the packages a test asks for.
INPUTS = (
    (PACKAGE_PARENT / "localcluster", ("*.py", "*.sh")),
    (CHECKOUT / "kimi_deploy", ("*.py", "*.json")),
    (CHECKOUT / "recipes", ("*.yaml",)),
)
INPUT_ENV = ("KIMI_CLUSTER_PACKAGES",)


def checkout_stamp() -> str:
    """A digest of what the services' content is built from (``INPUTS``, the environment's
    ``INPUT_ENV``): when it is the one a running service was started with, that service serves
    what this checkout would build."""
    digest = hashlib.sha256()
    for top, patterns in INPUTS:
        files = sorted({p for pattern in patterns for p in top.rglob(pattern) if p.is_file()})
        for path in files:
            digest.update(f"{path.relative_to(top.parent)}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    for name in INPUT_ENV:
        digest.update(f"{name}={os.environ.get(name, '')}\n".encode())
    return digest.hexdigest()[:16]


def _prepare(settings: Settings, service: Service) -> None:
    """Build the service's content (each ``prepare`` writes only what is missing)."""
    args = (url(settings, service),) if service.prepare_with_url else ()
    _run_hook(service, service.prepare, root_dir(settings, service), *args)
    root_dir(settings, service).mkdir(parents=True, exist_ok=True)


def _start(settings: Settings, service: Service) -> int:
    address = settings.gateway
    if _accepts(address, service.port):
        raise ClusterError(
            f"service {service.name}: {address}:{service.port} is taken by a process this cluster did not start"
        )
    _prepare(settings, service)
    path = log_file(settings, service)
    # `python -m` finds this package from its parent directory even when it is not installed.
    proc = launch_detached(argv(settings, service), path, f"starting {service.name}", cwd=PACKAGE_PARENT)
    _started.append(proc)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _accepts(address, service.port):
        if proc.poll() is not None:
            raise ClusterError(
                f"service {service.name}: exited with {proc.returncode} before listening on "
                f"{address}:{service.port}; see {path}",
                log_tail(path),
            )
        if time.monotonic() > deadline:
            # Not recorded anywhere yet, so end it here rather than leave it behind.
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise ClusterError(
                f"service {service.name}: not listening on {address}:{service.port} "
                f"after {READY_TIMEOUT_S:.0f} s; see {path}",
                log_tail(path),
            )
        time.sleep(0.1)
    log.info("service %s: %s (pid %d)", service.name, url(settings, service), proc.pid)
    return proc.pid


def ensure(settings: Settings, recorded: dict[str, ServiceRecord]) -> None:
    """Every service runs: recorded ones still alive and started from what this checkout builds
    (``checkout_stamp``) are kept; the others are started, after one started by another checkout
    or older code (another model commit, another pinned release) is stopped.

    ``recorded`` is updated in place as each one starts, so a failure part way leaves every service
    that did start recorded (and ``down`` able to stop it). A service whose module is not
    installed is skipped with a log line.
    """
    stamp = checkout_stamp()
    for service in SERVICES:
        old = recorded.get(service.name)
        if importlib.util.find_spec(service.module) is None:
            log.info("service %s: skipped, module %s is not there", service.name, service.module)
            if old is not None:
                stop(settings, {service.name: old})
                del recorded[service.name]
            continue
        if old is not None and is_running(settings, service, old.pid):
            if old.content == stamp:
                continue
            log.info("service %s: started by another checkout or code, restarting it", service.name)
            stop(settings, {service.name: old})
        recorded[service.name] = ServiceRecord(url=url(settings, service), pid=_start(settings, service), content=stamp)


def stop(settings: Settings, recorded: dict[str, ServiceRecord]) -> None:
    """Stop the recorded services (SIGTERM, SIGKILL after 5 s); other processes are never touched."""
    known = {s.name: s for s in SERVICES}
    live = []
    for name, record in recorded.items():
        service = known.get(name)
        if service is not None and is_running(settings, service, record.pid):
            os.kill(record.pid, signal.SIGTERM)
            live.append((service, record.pid))
    for sig in (signal.SIGKILL, None):
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while live and time.monotonic() < deadline:
            for _, pid in live:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            live = [(s, pid) for s, pid in live if is_running(settings, s, pid)]
            if live:
                time.sleep(0.05)
        if not live:
            return
        if sig is not None:
            for service, pid in live:
                log.warning("service %s: still up after SIGTERM, killing pid %d", service.name, pid)
                os.kill(pid, sig)
    raise ClusterError("services " + ", ".join(f"{s.name} (pid {pid})" for s, pid in live) + ": survive SIGKILL")
