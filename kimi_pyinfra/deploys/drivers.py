"""Pinned drivers on each host: ``pyinfra INVENTORY deploys/drivers.py`` (also a step of kimi.py).

NVIDIA hosts get NVIDIA's driver from its apt repository (host data ``kimi_nvidia_repo_url``,
default NVIDIA's own), in the order NVIDIA's guide gives: ``cuda-keyring``, the pinning package of
``drivers.nvidia`` (branch or exact version), then the driver set with the fabric manager
(hosts with NVSwitches: 8-GPU HGX boards; one left on a Grace Blackwell tray is removed) and IMEX
(an engine instance over several Grace Blackwell trays, with IMEX channel 0's module option, its node list
rendered from the plan) at the driver's version, all held. A host whose installed driver is not
the loaded one reboots only with ``--data kimi_reboot=allowed``, one host at a time, and NVML must
report the installed driver when it is back; without it the host stops with one line saying so.
TPU hosts get the kernel settings serving needs, nothing of NVIDIA. One probe round-trip per host
decides; a converged host adds no operation. What would leave a host inconsistent (a fabric manager
of another version than the driver, a reboot not allowed) stops it before any change.
"""

from __future__ import annotations

from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.driver_steps import driver_steps, planned
from kimi_pyinfra.host_plan import plan_for
from kimi_pyinfra.inventory_probe import answered
from kimi_pyinfra.rehearsal import converge_host
from kimi_pyinfra.run_context import in_run


@in_run
@pyinfra_deploy("drivers")
def deploy_drivers() -> None:
    """Pinned drivers on each host: ``pyinfra INVENTORY deploys/drivers.py`` (also a step of kimi.py)."""
    try:
        deploy = plan_for(inventory, host)
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None

    # Within a run that probed every host already (deploys/kimi.py), its answer; else read here.
    probed = answered(host)
    todo, found, request = planned(deploy, probed["drivers"] if probed is not None else None)
    converge_host(lambda do: driver_steps(do, deploy, todo, found, request))
