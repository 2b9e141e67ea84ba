"""Every step ``deploys/kimi.py`` takes on each host of an inventory, recorded by a pyinfra run
that connects nowhere: the deploy function runs for every host, each host's probe answered as the
test says, and each step it takes is kept with its arguments rather than made into operations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pyinfra.api.config import Config
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_inventory, ctx_state, host
from pyinfra_cli.inventory import make_inventory_from_files

from kimi_deploy.converge.plan import Converge
from kimi_pyinfra import stop_signals
from kimi_pyinfra.deploys import kimi
from kimi_pyinfra.facts.host_state import KimiHostState
from kimi_pyinfra.host_plan import todo_for
from kimi_pyinfra.run_context import Probe, RunContext, run_context
from tests.conftest import ROOT

# host -> the steps it took, in order: (operation, its arguments)
Steps = dict[str, list[tuple[Any, dict[str, Any]]]]


def drivers_answer() -> dict[str, Any]:
    """``hostside/driver_probe.py``'s answer on a new Debian 12 host: no driver, no file."""
    os_release = {"id": "debian", "version_id": "12", "arch": "amd64", "pretty": "Debian GNU/Linux 12"}
    return {"os": os_release, "packages": {}, "files": {}, "owners": {}, "services": {}, "sysctl": {}}


def recorded_run(inventory_file: str, answer: Callable[[Converge], Any]) -> tuple[Steps, RunContext]:
    """Every step the deploy takes on each host of ``inventory_file``, by host, and the run's
    context (``answer(todo)``: the probe's answer of a host with that converge, a ``HostState`` or
    a test's variation of one; its drivers part is a new host's)."""
    with ctx_state.use(State()):
        # a new host installs the driver and reboots into it (``--data kimi_reboot=allowed``)
        inventory = make_inventory_from_files(inventory_file, override_data={"kimi_reboot": "allowed"}, cwd=str(ROOT))
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    for h in inventory:
        state.activate_host(h)  # as connecting does  # type: ignore[no-untyped-call]
    steps: Steps = {}

    def record(op: Any, /, **arguments: Any) -> None:
        steps.setdefault(host.name, []).append((op, arguments))

    with pytest.MonkeyPatch.context() as patch, ctx_state.use(state), ctx_inventory.use(inventory):
        # the steps themselves, not pyinfra's operations made of them
        patch.setattr(kimi, "converge_host", lambda converge: converge(record))
        patch.setattr(stop_signals, "install", lambda state: None)
        context = run_context()
        context.step_lines = True  # no progress lines, no connection settings: nothing connects
        answers = {h.name: answer(todo_for(inventory, h)[1]) | {"drivers": drivers_answer()} for h in inventory}
        probe = Probe(results=answers)
        probe.done.set()
        context.probes[f"{KimiHostState.__module__}.{KimiHostState.__name__}"] = probe
        for h in inventory:
            with ctx_host.use(h):
                kimi.deploy_kimi()
    return steps, context
