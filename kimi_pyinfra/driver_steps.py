"""The drivers step of a host, as deploys/drivers.py runs it alone and deploys/kimi.py as its own
first step: pinned NVIDIA driver (repository, pin, packages held, IMEX node list, the reboot
into it, fabric manager and IMEX services) or the TPU host settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pyinfra.context import host

from kimi_deploy.accelerators.interface import DriversPlan
from kimi_deploy.host.drivers import plan_drivers, probe_request
from kimi_deploy.hostside.probe_types import DriversAnswer
from kimi_deploy.hostside.requests import DriversRequest
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_pyinfra.facts.drivers import DriversState
from kimi_pyinfra.operations import nvidia, preflight, sysctl, units
from kimi_pyinfra.rehearsal import Do


def planned(
    deploy: DeployPlan, probed: DriversAnswer | None
) -> tuple[DriversPlan, DriversAnswer | dict[str, Any], DriversRequest]:
    """This host's drivers plan, the drivers probe's answer and its request; ``probed`` is that
    answer when the host probe has read it already in its round-trip (None: read it here)."""
    request = probe_request(deploy.recipe, deploy.spec)
    found: DriversAnswer | dict[str, Any] = (probed or host.get_fact(DriversState, request=request)) if request else {}
    todo = plan_drivers(
        deploy.recipe,
        deploy.spec,
        deploy.topology,
        found,
        repo_url=deploy.host.vars.kimi_nvidia_repo_url,
        reboot_allowed=deploy.host.vars.kimi_reboot == "allowed",
    )
    return todo, found, request


def driver_steps(
    do: Do, deploy: DeployPlan, todo: DriversPlan, found: Mapping[str, Any], request: DriversRequest
) -> None:
    """Every operation of the drivers step, through ``do`` (``kimi_pyinfra.rehearsal``)."""
    do(preflight.passed, name="Drivers: checks", failures=list(todo.refusals))
    nv = todo.nvidia
    if nv is not None:
        repo = nv.repository
        do(
            nvidia.repository,
            name="NVIDIA repository",
            url=repo.url,
            keyring=repo.keyring,
            present=repo.present,
            refresh=repo.refresh,
        )
        do(nvidia.pinned, name="NVIDIA driver pin", package=nv.pin, installed=nv.pin_installed, repository=repo.url)
        if nv.remove:
            do(nvidia.removed, name="NVIDIA fabric manager removed", packages=list(nv.remove))
        if nv.module_options is not None:
            # before the driver: its module reads the options when it loads, after the install's reboot
            do(
                units.rendered,
                name="NVIDIA module options",
                files=[nv.module_options],
                group="root",
                current=found["files"],
                owners=found["owners"],
            )
        do(
            nvidia.packages,
            name="NVIDIA driver packages",
            install=list(nv.install),
            hold=list(nv.packages),
            unheld=list(nv.unheld),
            headers=nv.headers,
            version=nv.target_text,
            keep_loaded=nv.keep_loaded,
            reboot_line=nv.reboot_line,
        )
        # the modules file is read by systemd-modules-load at boot; loaded now by the fabric
        # manager's service step
        files = (
            ("NVLink subnet manager modules", nv.modules_file),
            ("IMEX nodes", nv.imex_nodes),
            ("IMEX channel unit", nv.imex_channel),
        )
        for name, file in files:
            if file is not None:
                do(
                    units.rendered,
                    name=name,
                    files=[file],
                    group="root",
                    current=found["files"],
                    owners=found["owners"],
                )
        do(
            nvidia.rebooted,
            name="Reboot into the NVIDIA driver",
            reboot=nv.reboot,
            allowed=deploy.host.vars.kimi_reboot == "allowed",
            driver_package=nv.packages[0],
            request=request,
            _serial=True,
        )
        for service in nv.services:
            do(nvidia.service, name="NVIDIA services", **dataclasses.asdict(service))
    if todo.sysctl is not None:
        do(
            units.rendered,
            name="TPU host settings",
            files=[todo.sysctl.file],
            group="root",
            current=found["files"],
            owners=found["owners"],
        )
        do(
            sysctl.applied,
            name="TPU host settings applied",
            file=todo.sysctl.file.path,
            values=dict(todo.sysctl.values),
            current=dict(todo.sysctl.current),
        )
