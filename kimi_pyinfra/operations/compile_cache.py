"""Engines' compile caches: placed and given to the engine before it starts, packed after, and
passed within a run from the batch that compiled to the later ones."""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Mapping
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from kimi_deploy.compile_cache.pins import pins
from kimi_deploy.converge.compile_caches import FromThisRun
from kimi_deploy.host.programs import COMPILE_CACHE_PACK, COMPILE_CACHE_PLACE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_names import BadName, check_names
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.hostside.compile_cache_found import entry_ok, manifest_digest
from kimi_deploy.hostside.requests import CompileCachePackRequest, CompileCachePlaceRequest, Lock
from kimi_pyinfra.operations.connector import connector_arguments
from kimi_pyinfra.operations.weights import peer_command
from kimi_pyinfra.run_context import run_context

# What ``compile_cache_place.py`` answers (weights_sync.py's ``error``) when its source failed it:
# no peer gave a file (gone, refusing, or its bytes did not match the manifest).
_SOURCE_FAILED = "peers"
# The most a warning quotes of what a host said.
_WHY_CHARS = 200


@operation()
def placed(*, request: CompileCachePlaceRequest | None, unit: str) -> Generator[FunctionCommand, None, None]:
    """
    Hold the compile cache of ``unit``'s key, the manifest the controller holds, and give the
    engine its copy, before the engine (re)starts.

    + request: ``hostside/compile_cache_place.py``'s (``kimi_deploy.converge.compile_caches``):
      the artifact folder, the manifest, the peers holding it and the run's transfer key; the
      engine's cache folder and user; None: the host holds it and the engine has its copy
    + unit: the engine unit, for the no-op message

    A source that fails the transfer (it went away, or its bytes do not match) fails nothing: one
    line says so, and the engine starts as it would without a cache (it compiles); nothing
    partial is given to it, and the next run completes the placement.
    """
    if request is None:
        host.noop(f"{unit}: its compile cache is in place, or none is made yet")
        return
    yield _placing(lambda state, host: request)


@operation()
def placed_from_run(*, receives: FromThisRun | None, unit: str) -> Generator[FunctionCommand, None, None]:
    """
    Place the compile cache a host of an earlier batch packed in this run, and give the engine
    its copy, before this host's batch starts: verified against the manifest that pack answered
    and the controller holds, learnt when the step runs.

    + receives: the artifact, the host that packs it and the placement's request
      (``kimi_deploy.converge.compile_caches.FromThisRun``); None: nothing comes here this run
    + unit: the engine unit, for the no-op message

    When that host packed nothing the controller holds (it failed, compiled nothing, its pack was
    past bounds), or its relay fails the transfer, one line says so and the engine compiles as it
    would.
    """
    if receives is None:
        host.noop(f"{unit}: no compile cache of an earlier batch comes here this run")
        return
    yield _from_run(receives, run_context().compile_caches_packed)


def _from_run(receives: FromThisRun, packed: Mapping[str, Lock]) -> FunctionCommand:
    """The placement of ``receives``, with the manifest ``packed`` holds for it when it runs."""

    def request(state: State, host: Host) -> CompileCachePlaceRequest | None:
        manifest = packed.get(receives.name)
        if manifest is None:
            host.log_styled(
                f"{host.name}: compile cache {receives.name}: {receives.source} packed none this run: "
                "the engine compiles its own",
                fg="yellow",
                log_func=logger.warning,
            )
            return None
        return {**receives.request, "manifest": dict(manifest)}

    return _placing(request)


def _placing(request_of: Callable[[State, Host], CompileCachePlaceRequest | None]) -> FunctionCommand:
    """``compile_cache_place.py`` with the request ``request_of`` makes when the step runs
    (None: nothing to place); a failure of its source said in one line, not failed."""
    arguments = connector_arguments()

    def run(state: State, host: Host) -> bool:
        request = request_of(state, host)
        if request is None:
            return True
        command = COMPILE_CACHE_PLACE.command("/usr/bin/python3", request)
        ok, output = host.run_shell_command(command, print_output=state.print_output, **arguments)
        if ok:
            return True
        name = request["dir"].rsplit("/", 1)[-1]
        why = _source_failed(output.stdout_lines, len(request["manifest"]), f"{host.name}: compile cache {name}")
        if why is not None:
            host.log_styled(
                f"{host.name}: compile cache {name}: not placed ({why}): the engine compiles its own; "
                "the next run places it",
                fg="yellow",
                log_func=logger.warning,
            )
            return True
        for text in output.stderr_lines or output.stdout_lines or ["compile cache placement failed"]:
            host.log_styled(printable(text), fg="red", log_func=logger.error)
        return False

    return FunctionCommand(run, (), {})


def _source_failed(stdout: list[str], files: int, where: str) -> str | None:
    """Why the placement's source failed it, as its answer says (``weights_sync.py``'s: the files
    no peer gave, and each one's last cause); None when the failure is not the source's."""
    try:
        said = loads((stdout or ["{}"])[-1], where)
    except ValueError:
        return None
    if not isinstance(said, dict) or said.get("error") != _SOURCE_FAILED:
        return None
    missing = said.get("files")
    missing = [m for m in missing if isinstance(m, str)] if isinstance(missing, list) else []
    causes = said.get("peer_failures")
    causes = {k: v for k, v in causes.items() if isinstance(v, str)} if isinstance(causes, dict) else {}
    # the first file's cause, as the program's own line says it
    cause = causes.get(missing[0]) if missing else None
    cause = cause or next(iter(causes.values()), None)
    arrived = f"{len(missing)} of {files} files did not arrive"
    return printable(f"{arrived}; {cause}" if cause else arrived)[:_WHY_CHARS]


def checked_manifest(said: Any, where: str) -> dict[str, list[Any]]:
    """The manifest in a pack's answer, as the controller may hold it: ``{path: [size,
    "sha256:<hex>"]}`` with every path a plain relative name; ``ValueError`` naming ``where`` else."""
    manifest = said.get("manifest") if isinstance(said, dict) else None
    if not isinstance(manifest, dict):
        raise ValueError(f"{where}: the pack's answer holds no manifest")
    try:
        check_names(manifest)
    except BadName as exc:
        raise ValueError(f"{where}: {exc}") from None
    for rel, entry in manifest.items():
        if not entry_ok(entry):
            raise ValueError(f"{where}: {rel}: expected [size, sha256:<hex>], found {entry!r:.80}")
    return manifest


def _pack(command: str, name: str, held: Mapping[str, Any] | None, packed: dict[str, Lock]) -> FunctionCommand:
    """The pack, its manifest held by the controller when it holds none for ``name`` yet, and kept
    in ``packed`` (the run's) when the controller holds it: the later batches receive it."""
    arguments = connector_arguments()

    def run(state: State, host: Host) -> bool:
        ok, output = host.run_shell_command(command, print_output=state.print_output, **arguments)
        if not ok:
            for text in output.stderr_lines or output.stdout_lines or ["compile cache pack failed"]:
                host.log_styled(text, fg="red", log_func=logger.error)
            return False
        where = f"{host.name}: compile cache {name}"
        try:
            manifest = checked_manifest(loads((output.stdout_lines or ["{}"])[-1], where), where)
        except ValueError as exc:
            host.log_styled(str(exc), fg="red", log_func=logger.error)
            return False
        if not manifest:
            host.log_styled(f"{where}: the engine compiled nothing to pack", log_func=logger.info)
        elif held is None:
            pins(os.environ).put(name, manifest, host.name)
            packed[name] = manifest
            size = sum(entry[0] for entry in manifest.values())
            host.log_styled(
                f"{where}: packed {len(manifest)} files, {size} bytes, held as {manifest_digest(manifest)}",
                log_func=logger.info,
            )
        elif dict(held) != manifest:
            host.log_styled(f"{where}: packed, not the one the controller holds: not used", log_func=logger.warning)
        else:
            packed[name] = manifest
        return True

    return FunctionCommand(run, (), {})


@operation()
def packed(
    *, request: CompileCachePackRequest | None, held: Mapping[str, Any] | None
) -> Generator[FunctionCommand, None, None]:
    """
    Pack what the engine compiled into the artifact of its key, once its batch answers its smoke
    tests, on the host the run chose to compile; the controller holds the manifest it answers,
    and the hosts of later batches of the key receive it in this run.

    + request: ``hostside/compile_cache_pack.py``'s, None: not this host (or not this batch)
    + held: the manifest the controller holds for the key already (None: none)
    """
    if request is None:
        host.noop("no compile cache to pack here")
        return
    name = request["dir"].rsplit("/", 1)[-1]
    yield _pack(
        COMPILE_CACHE_PACK.command("/usr/bin/python3", request), name, held, run_context().compile_caches_packed
    )


@operation()
def served_packed(
    *, path: str, bind: str, port: int | None, allow: list[str], key_file: str, user: str
) -> Generator[FunctionCommand, None, None]:
    """
    Serve the compile cache this host packed in this run to the hosts of later batches of its
    key, through the weights' relay, until the run ends (``weights.peer_server_stopped``).

    + path: the artifact folder (``/var/lib/kimi/compile-caches/<unit>-<key>``)
    + bind: the host's address on the cluster network
    + port: the recipe's ``weights.fan_out.port``
    + allow: the addresses of the hosts that receive it; empty: none (nothing served)
    + key_file: the host file with this run's transfer key (readable by ``user``)
    + user: the unprivileged user the service runs as

    The files are served against the manifest the pack answered and the controller holds,
    learnt when the step runs; when there is none (the pack failed, or made nothing the
    controller holds), nothing is served and the hosts that would receive it compile their own.
    """
    if not allow or port is None:
        host.noop("no host of a later batch receives a compile cache from here")
        return
    yield _serve(
        path=path,
        packed=run_context().compile_caches_packed,
        bind=bind,
        port=port,
        allow=allow,
        key_file=key_file,
        user=user,
    )


def _serve(
    *, path: str, packed: Mapping[str, Lock], bind: str, port: int, allow: list[str], key_file: str, user: str
) -> FunctionCommand:
    """The relay of ``path`` with the manifest ``packed`` holds for it when it runs."""
    arguments = connector_arguments()
    name = path.rsplit("/", 1)[-1]

    def run(state: State, host: Host) -> bool:
        manifest = packed.get(name)
        if manifest is None:
            host.log_styled(f"{host.name}: compile cache {name}: none packed this run to serve", log_func=logger.info)
            return True
        command = peer_command(
            path=path, lock=dict(manifest), bind=bind, port=port, allow=allow, key_file=key_file, user=user
        )
        ok, output = host.run_shell_command(command, print_output=state.print_output, **arguments)
        if not ok:  # this host serves all the same; the later batches compile their own
            why = printable((output.stderr_lines or ["the relay did not start"])[-1])[:_WHY_CHARS]
            host.log_styled(
                f"{host.name}: compile cache {name}: not served to the later batches ({why})",
                fg="yellow",
                log_func=logger.warning,
            )
        return True

    return FunctionCommand(run, (), {})
