"""Engines' compile caches: placed and given to the engine before it starts, packed after."""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from kimi_deploy.compile_cache.pins import pins
from kimi_deploy.host.programs import COMPILE_CACHE_PACK, COMPILE_CACHE_PLACE
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_names import BadName, check_names
from kimi_deploy.hostside.compile_cache_found import entry_ok, manifest_digest
from kimi_deploy.hostside.requests import CompileCachePackRequest, CompileCachePlaceRequest
from kimi_pyinfra.operations.connector import connector_arguments


@operation()
def placed(*, request: CompileCachePlaceRequest | None, unit: str) -> Generator[str, None, None]:
    """
    Hold the compile cache of ``unit``'s key, the manifest the controller holds, and give the
    engine its copy, before the engine (re)starts.

    + request: ``hostside/compile_cache_place.py``'s (``kimi_deploy.converge.compile_caches``):
      the artifact folder, the manifest, the peers holding it and the run's transfer key; the
      engine's cache folder and user; None: the host holds it and the engine has its copy
    + unit: the engine unit, for the no-op message
    """
    if request is None:
        host.noop(f"{unit}: its compile cache is in place, or none is made yet")
        return
    yield COMPILE_CACHE_PLACE.command("/usr/bin/python3", request)


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


def _pack(command: str, name: str, held: Mapping[str, Any] | None) -> FunctionCommand:
    """The pack, its manifest held by the controller when it holds none for ``name`` yet."""
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
            size = sum(entry[0] for entry in manifest.values())
            host.log_styled(
                f"{where}: packed {len(manifest)} files, {size} bytes, held as {manifest_digest(manifest)}",
                log_func=logger.info,
            )
        elif dict(held) != manifest:
            host.log_styled(f"{where}: packed, not the one the controller holds: not used", log_func=logger.warning)
        return True

    return FunctionCommand(run, (), {})


@operation()
def packed(
    *, request: CompileCachePackRequest | None, held: Mapping[str, Any] | None
) -> Generator[FunctionCommand, None, None]:
    """
    Pack what the engine compiled into the artifact of its key, once it answers its smoke test,
    on the host the run chose to compile; the controller holds the manifest it answers.

    + request: ``hostside/compile_cache_pack.py``'s, None: not this host
    + held: the manifest the controller holds for the key already (None: none)
    """
    if request is None:
        host.noop("no compile cache to pack here")
        return
    name = request["dir"].rsplit("/", 1)[-1]
    yield _pack(COMPILE_CACHE_PACK.command("/usr/bin/python3", request), name, held)
