"""Model weights: one folder per pinned revision, synced and verified against the lock."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.host.programs import WEIGHTS_PEER, WEIGHTS_SYNC
from kimi_deploy.hostside.probe_types import WeightsFound
from kimi_deploy.hostside.requests import PeerRequest, PeerSource, SyncRequest
from kimi_deploy.hostside.revision_files import PROGRESS, meta
from kimi_deploy.listener_sandbox import LISTENER_SANDBOX, stop_unit, transient_service
from kimi_deploy.weights.fanout import needs_sync
from kimi_pyinfra.progress_reads import progress_at


@operation()
def revision(
    *,
    request: SyncRequest,
    python: str,
    current: WeightsFound | None,
    full_verify: bool = False,
    peers: list[PeerSource] | None = None,
    peer_key_file: str | None = None,
    in_order: bool = False,
) -> Generator[str, None, None]:
    """
    Hold exactly the files of the request's ``repo`` at its ``revision`` in its ``dir``, each
    matching its ``lock``.

    + request: ``kimi_deploy.converge.plan.sync_request`` of the weights target: ``repo``, ``revision``,
      ``dir`` (e.g. ``/srv/models/moonshotai--Kimi-K3.1-Pro/<revision>``), ``lock`` (``{path: [size,
      digest]}``), ``endpoint`` (None: huggingface_hub's default), ``token_file`` (mode 0600, if
      any), ``progress_log`` (bytes, rate and ETA of long transfers every few seconds)
    + python: the interpreter of the venv holding huggingface_hub
    + current: what the host probe found (missing, unverified and extra files)
    + full_verify: re-hash every file now, whatever the cache says (finds silent corruption)
    + peers: where to copy files from before the Hub: a local mirror folder (``{"host", "path"}``)
      and hosts of this run serving the revision (``{"host", "url"}``)
    + peer_key_file: the host file holding this run's transfer key (with ``peers``)
    + in_order: hosts fetch from this one while it fetches: what comes from the Hub comes one file
      at a time in the lock's order, each served once verified

    Files are verified on the host (sha256 for LFS files, git blob ids for small ones), results
    cached by (size, mtime, inode): a converged host hashes nothing. While files arrive, the step's
    line says their bytes over the hosts (``<dir>/.kimi/progress``: ``kimi_pyinfra.progress_reads``).
    """
    if not full_verify and not needs_sync(current):
        repo, revision = request["repo"], request["revision"]
        host.noop(f"{repo}@{revision[:12]}: all {len(request['lock'])} files verified in {request['dir']}")
        return
    sync: SyncRequest = {
        **request,
        "full": full_verify,
        "peers": peers or [],
        "peer_key_file": peer_key_file,
        "in_order": in_order,
    }
    progress_at(meta(request["dir"], PROGRESS))
    yield WEIGHTS_SYNC.command(python, sync)


PEER_UNIT = "kimi-weights-peer"
# The transient service's sandbox: it reads the revision and its key, and listens; nothing else.
_PEER_PROPERTIES = (
    *LISTENER_SANDBOX,
    # A run that dies before stopping it leaves nothing listening for long.
    "RuntimeMaxSec=21600",
    # Whatever clients do, it stays small: at most 32 connections (a thread and two files each)
    # and a few MiB of Python; file data goes out with sendfile.
    "MemoryMax=256M",
    "TasksMax=64",
    "LimitNOFILE=256",
)


def _stop() -> str:
    return stop_unit(PEER_UNIT)


@operation()
def peer_server(
    *,
    path: str,
    lock: dict[str, list[Any]],
    bind: str,
    port: int,
    allow: list[str],
    key_file: str,
    user: str,
    fetching: bool = False,
) -> Generator[str, None, None]:
    """
    Serve the verified files of a revision to the other hosts of this run.

    + path: the revision's folder
    + lock: ``{path: [size, digest]}``: only files the lock names, verified, are served
    + bind: the host's address on the cluster network (never every address)
    + port: the recipe's ``weights.fan_out.port``
    + allow: addresses of the hosts that fetch from this one
    + key_file: the host file with this run's transfer key (readable by ``user``)
    + user: the unprivileged user the service runs as
    + fetching: this host's own sync brings files in this run: each is relayed as it arrives (its
      last byte once verified), and a file still to come is waited for rather than refused

    The transient ``kimi-weights-peer`` service answers only once it listens (systemd notify), so
    the hosts that fetch find it up; ``peer_server_stopped`` ends it when they are done, and it
    exits by itself after five idle minutes, or six hours whatever happens.
    """
    yield peer_command(
        path=path, lock=lock, bind=bind, port=port, allow=allow, key_file=key_file, user=user, fetching=fetching
    )


def peer_command(
    *,
    path: str,
    lock: dict[str, list[Any]],
    bind: str,
    port: int,
    allow: list[str],
    key_file: str,
    user: str,
    fetching: bool = False,
) -> str:
    """The shell command of ``peer_server`` (its arguments): for an operation that learns the
    lock only when it runs (``operations.compile_cache.served_packed``)."""
    request: PeerRequest = {
        "dir": path,
        "lock": lock,
        "bind": bind,
        "port": port,
        "allow": sorted(allow),
        "key_file": key_file,
        "fetching": fetching,
        "idle_exit_s": 300,
    }
    return transient_service(
        PEER_UNIT,
        f"kimi-deploy: serve {path} to the other hosts of this run",
        (*_PEER_PROPERTIES, f"User={user}", f"ReadOnlyPaths={path}"),
        WEIGHTS_PEER.command("/usr/bin/python3", request),
    )


@operation()
def peer_server_stopped() -> Generator[str, None, None]:
    """
    Stop serving weights to other hosts (the transient ``kimi-weights-peer`` service).
    """
    yield _stop()


@operation()
def collected(*, parent: str, keep: list[str], remove: list[str]) -> Generator[str, None, None]:
    """
    Remove a model's revisions that are neither served nor the rollback copy.

    + parent: the model's folder of revisions
    + keep: the revisions that stay (served, rollback copy), for the no-op message
    + remove: the revisions to delete (``kimi_deploy.weights.gc.collectable``)

    Files hard-linked between revisions stay as long as a kept revision names them.
    """
    if not remove:
        host.noop(f"{parent} holds only {', '.join(r[:12] for r in keep)}")
        return
    yield " && ".join(f"rm -rf -- {shlex.quote(parent + '/' + r)}" for r in remove)
