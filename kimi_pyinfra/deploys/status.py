"""Show what serves where and how to ask it, changing nothing: ``pyinfra INVENTORY deploys/status.py``.

One probe round-trip per host, all hosts at once (``kimi_pyinfra.inventory_probe``), reading the
state the converge reads: the converge's own request (``kimi_deploy.converge.plan.converge_request``,
planned as ``kimi-deploy plan`` plans, no secret read), with the release records the host keeps.
Then one table of every host's units (role, systemd state and since when, the watchdog's state, the
last smoke test, the release serving and its weights revision), what needs an eye, the benchmark
figures kept with the releases serving, and each topology's endpoints with a curl that asks it
(``kimi_deploy.serving.status_table``), on stdout. ``kimi-deploy status INVENTORY`` runs it with
pyinfra's own lines held back but for warnings and errors.
"""

from __future__ import annotations

import sys
from typing import Any

from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.context import host, inventory, state

from kimi_deploy.converge.plan import Converge, converge_request, plan_converge
from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.hostside.requests import StateRequest
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.serving.status_table import HostStatus, format_status
from kimi_pyinfra.host_plan import plan_for
from kimi_pyinfra.inventory_probe import probe_all
from kimi_pyinfra.run_context import in_run, run_context


def _planned(h: Host) -> tuple[DeployPlan, Converge]:
    """``h``'s part of the plan and its converge, as ``kimi-deploy plan`` makes them: no secret is
    read (the units' digests and the release are the converge's). ``ConfigError`` as ``plan_for``."""
    deploy = plan_for(inventory, h)
    return deploy, plan_converge(deploy, run_context().environ, plan_only=True)


def status_request(h: Host) -> dict[str, Any]:
    """What ``h``'s probe reads: its converge's state, and the release records it keeps."""
    request: StateRequest = {**converge_request(_planned(h)[1]), "releases": True}
    return {"request": request}


def _status(h: Host, probed: dict[str, Any]) -> HostStatus:
    try:
        deploy, todo = _planned(h)
    except ConfigError as exc:
        return HostStatus(h.name, None, None, None, str(exc))
    if h.name not in probed:
        return HostStatus(h.name, deploy, todo, None, "not connected")
    found = probed[h.name]
    if isinstance(found, BaseException):
        return HostStatus(h.name, deploy, todo, None, str(found) or type(found).__name__)
    return HostStatus(h.name, deploy, todo, found)


@in_run
@pyinfra_deploy("status")
def deploy_status() -> None:
    """Show what serves where and how to ask it, changing nothing: ``pyinfra INVENTORY deploys/status.py``."""
    context = run_context()
    # The first host's deploy to ask probes every host at once; the others read the same answers.
    probed = probe_all(state, status_request)
    if not context.status_shown:
        context.status_shown = True
        # every host the run covers, those pyinfra could not connect to among them
        hosts = [h for h in state.inventory if state.is_host_in_limit(h)]
        sys.stdout.write(format_status([_status(h, probed) for h in hosts]))
        sys.stdout.flush()
    mine = probed.get(host.name)
    if isinstance(mine, ConfigError):
        raise PyinfraError(str(mine)) from None
    if isinstance(mine, BaseException):
        # what the host answered, if anything, is its text: shown, never acted on, by the terminal
        raise PyinfraError(printable(f"{host.name}: status probe: {mine}")) from None
