"""Building the planner's ``Inventory`` from pyinfra's own inventory, so both read a file alike."""

from __future__ import annotations

import io
import logging
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory, InventoryHost, make_host


def from_pyinfra(inventory: Any, source: str) -> Inventory:
    """Convert a live ``pyinfra.api.Inventory`` (as a deploy sees it) into an ``Inventory``."""
    groups: dict[str, tuple[str, ...]] = {
        name: tuple(h.name for h in hosts) for name, hosts in inventory.groups.items() if hosts
    }
    hosts: list[InventoryHost] = []
    for h in inventory:
        # pyinfra can list a group twice for a connector host (``@local``): keep each once.
        hosts.append(make_host(source, h.name, tuple(dict.fromkeys(h.groups)), h.data.dict()))
    return Inventory(source=source, hosts=tuple(hosts), groups=groups)


def pyinfra_inventory(path: str | Path, override_data: dict[str, Any] | None = None) -> Any:
    """pyinfra's own ``Inventory`` of an inventory file, loaded exactly as ``pyinfra INVENTORY ...``
    would, run from the cwd, with ``override_data`` as its ``--data`` gives it; ``ConfigError``
    naming the file when it is missing or its code fails."""
    shown = str(path)
    if not Path(path).is_file():
        raise ConfigError(shown, "", "no such inventory file")
    # Imported here: pyinfra's CLI package patches the standard library with gevent on import,
    # and only this function needs it.
    from pyinfra.api.state import State  # noqa: PLC0415
    from pyinfra.context import ctx_state  # noqa: PLC0415
    from pyinfra_cli.inventory import make_inventory_from_files  # noqa: PLC0415

    logging.getLogger("pyinfra").setLevel(logging.ERROR)
    try:
        # pyinfra executes inventory and group_data files inside a State context, as its CLI does.
        with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()), ctx_state.use(State()):
            return make_inventory_from_files(str(path), override_data=override_data, cwd=os.getcwd())
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's Python file can raise anything
        # pyinfra wraps what the file raised (UnexpectedExternalError.exception): name that.
        exc = getattr(exc, "exception", None) or exc
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(shown, "", f"cannot load inventory: {type(exc).__name__}: {detail}") from None


def load_inventory(path: str | Path) -> Inventory:
    """Load an inventory file exactly as ``pyinfra INVENTORY ...`` would, run from the cwd."""
    return from_pyinfra(pyinfra_inventory(path), str(path))
