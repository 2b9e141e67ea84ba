"""Pinned drivers on each host: ``pyinfra INVENTORY deploys/drivers.py`` (also a step of kimi.py).

NVIDIA hosts get NVIDIA's driver from its apt repository (host data ``kimi_nvidia_repo_url``,
default NVIDIA's own), in the order NVIDIA's guide gives: ``cuda-keyring``, the pinning package of
``drivers.nvidia`` (branch or exact version), then the driver set with the fabric manager
(NVSwitch systems) and IMEX (an engine instance over several Grace Blackwell trays, its node list
rendered from the plan) at the driver's version, all held. A host whose installed driver is not
the loaded one reboots only with ``--data kimi_reboot=allowed``, one host at a time, and NVML must
report the installed driver when it is back; without it the host stops with one line saying so.
TPU hosts get the kernel settings serving needs, nothing of NVIDIA. One probe round-trip per host
decides; a converged host runs no command. What would leave a host inconsistent (a fabric manager
of another version than the driver, a reboot not allowed) stops it before any change.
"""

from __future__ import annotations

import dataclasses

from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from facts.drivers import DriversState
from facts.inventory_probe import answered
from kimi_deploy.driver_plan import plan_drivers, probe_request
from kimi_deploy.errors import ConfigError
from kimi_pyinfra.host_plan import plan_for
from operations import nvidia, preflight, sysctl, units

try:
    deploy = plan_for(inventory, host)
except ConfigError as exc:
    raise PyinfraError(str(exc)) from None

request = probe_request(deploy.recipe, deploy.spec)
# Within deploys/kimi.py the host probe has read this already, in the same round-trip.
probed = answered(host)
known = probed["drivers"] if probed is not None else None
found = (known or host.get_fact(DriversState, request=request)) if request else {}
todo = plan_drivers(
    deploy.recipe,
    deploy.spec,
    deploy.topology,
    found,
    repo_url=deploy.host.vars.kimi_nvidia_repo_url,
    reboot_allowed=deploy.host.vars.kimi_reboot == "allowed",
)

preflight.passed(name="Drivers: checks", failures=list(todo.refusals))

nv = todo.nvidia
if nv is not None:
    repo = nv.repository
    nvidia.repository(
        name="NVIDIA repository", url=repo.url, keyring=repo.keyring, present=repo.present, refresh=repo.refresh
    )
    nvidia.pinned(name="NVIDIA driver pin", package=nv.pin, installed=nv.pin_installed)
    nvidia.packages(
        name="NVIDIA driver packages",
        install=list(nv.install),
        hold=list(nv.packages),
        unheld=list(nv.unheld),
        headers=nv.headers,
        version=nv.target_text,
        keep_loaded=nv.keep_loaded,
        reboot_line=nv.reboot_line,
    )
    if nv.imex_nodes is not None:
        units.rendered(name="IMEX nodes", files=[nv.imex_nodes], group="root", current=found["files"])
    nvidia.rebooted(
        name="Reboot into the NVIDIA driver",
        reboot=nv.reboot,
        allowed=deploy.host.vars.kimi_reboot == "allowed",
        driver_package=nv.packages[0],
        request=request,
        _serial=True,
    )
    for service in nv.services:
        nvidia.service(name="NVIDIA services", **dataclasses.asdict(service))

if todo.sysctl is not None:
    units.rendered(name="TPU host settings", files=[todo.sysctl.file], group="root", current=found["files"])
    sysctl.applied(
        name="TPU host settings applied",
        file=todo.sysctl.file.path,
        values=dict(todo.sysctl.values),
        current=dict(todo.sysctl.current),
    )
