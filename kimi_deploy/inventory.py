"""The inventory as the planner sees it: hosts in order, their groups and their kimi_* data.

Pure: built from a pyinfra inventory by ``kimi_pyinfra.inventory_file``; nothing here talks to hosts.
A host's address (``kimi_address``, else ``ssh_hostname``, else its name) is an IP address or a DNS
hostname, and no host name or ``kimi_*`` string holds a control character: all of them reach the
host's unit files (``kimi_deploy.render.safe_text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import control_char, shown
from kimi_deploy.recipe import AbsPath
from kimi_deploy.render.safe_text import check_address, is_address, refuse_control
from kimi_deploy.validation_error import first_error_line

IfName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:@-]{1,15}$")]
_ADDRESS_RULE = "an address must be an IP address or a DNS hostname"


class HostVars(BaseModel):
    """The host data keys kimi-deploy reads; any other ``kimi_*`` key is a typo."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)

    kimi_address: Annotated[str, StringConstraints(min_length=1), AfterValidator(check_address)] | None = None
    kimi_socket_ifname: IfName | None = None
    kimi_rdma_devices: (
        Annotated[list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_]+(:[0-9]+)?$")]], Field(min_length=1)]
        | None
    ) = None
    kimi_recipe: str | None = None
    kimi_pip_index_url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")] | None = None
    kimi_hf_endpoint: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")] | None = None
    # ``full`` re-hashes every weights file this run (the cache by size, mtime and inode is ignored).
    kimi_verify: Literal["cached", "full"] | None = None
    # The seconds between a long step's progress lines (``kimi_pyinfra.fleet_progress``; default 15).
    kimi_progress_tick_s: Annotated[float, Field(ge=0.1, le=3600, allow_inf_nan=False)] | None = None
    # NVIDIA's CUDA apt repository (or a mirror of it laid out the same way): ``<url>/debian12/x86_64/``.
    kimi_nvidia_repo_url: Annotated[str, StringConstraints(pattern=r"^https?://\S+$")] | None = None
    # ``allowed``: a host whose installed NVIDIA driver is not the loaded one is rebooted (one at a time).
    kimi_reboot: Literal["allowed"] | None = None
    # deploys/report.py: the host's folder whose filesystem it measures (default /srv/models), and
    # the controller's file it writes the report to as JSON (default kimi-report.json).
    kimi_models_dir: AbsPath | None = None
    kimi_report_json: Annotated[str, StringConstraints(min_length=1)] | None = None
    # deploys/ladder.py: the controller's file it writes the context ladder's proofs to (default kimi-ladder.json)
    kimi_ladder_json: Annotated[str, StringConstraints(min_length=1)] | None = None
    # deploys/bench.py: the controller's files it writes the serving benchmark's report to
    # (default kimi-bench.json and kimi-bench.png)
    kimi_bench_json: Annotated[str, StringConstraints(min_length=1)] | None = None
    kimi_bench_png: Annotated[str, StringConstraints(min_length=1)] | None = None
    # deploys/drill.py: the drill to inject on the hosts it runs on (kimi_deploy.converge.drills), and the
    # commands that inject the drills the deploy does not itself: {NAME: {"inject": CMD, "clear": CMD}}
    kimi_drill: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,40}$")] | None = None
    # link-cut: the host of this host's topology it is cut from, and for how long at most
    kimi_drill_peer: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")] | None = None
    kimi_drill_for_s: Annotated[int, Field(ge=1, le=86400)] = 60
    kimi_drill_faults: (
        dict[
            Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,40}$")],
            dict[Literal["inject", "clear"], Annotated[str, StringConstraints(min_length=1)]],
        ]
        | None
    ) = None

    @field_validator("*")
    @classmethod
    def _no_control_characters(cls, value: Any) -> Any:
        return refuse_control(value)


@dataclass(frozen=True)
class InventoryHost:
    name: str
    groups: tuple[str, ...]
    address: str
    vars: HostVars


@dataclass(frozen=True)
class Inventory:
    """Hosts in inventory order; ``groups`` maps each group to its host names in order."""

    source: str
    hosts: tuple[InventoryHost, ...]
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def host(self, name: str) -> InventoryHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)


def make_host(source: str, name: str, groups: tuple[str, ...], data: Mapping[str, Any]) -> InventoryHost:
    """Validate one host's data; ``ConfigError`` names the inventory file, host and field.

    A pyinfra connector host (``@local``, ``@docker/...``) without ``kimi_address`` or
    ``ssh_hostname`` has no address of its own: its name stands for it, fit for a one-host
    topology that peers never reach."""
    where = f"{source}: host {name}"
    char = control_char(name)
    if char:
        raise ConfigError(f"{source}: host {shown(name)}", "", f"the host name holds control character {char}")
    ours = {k: v for k, v in data.items() if k.startswith("kimi_")}
    try:
        host_vars = HostVars.model_validate(ours)
    except ValidationError as exc:
        raise first_error_line(where, exc, HostVars) from None
    ssh = data.get("ssh_hostname")
    if ssh is not None and not isinstance(ssh, str):
        raise ConfigError(where, "ssh_hostname", f"expected a string, found {shown(ssh)}")
    if host_vars.kimi_address:
        address = host_vars.kimi_address
    elif ssh is not None:
        if not is_address(ssh):
            rule = f"is the host's address without kimi_address: {_ADDRESS_RULE}"
            raise ConfigError(where, "ssh_hostname", f"{rule}, found {shown(ssh)}")
        address = ssh
    elif name.startswith("@") or is_address(name):
        address = name
    else:
        raise ConfigError(
            where, "", f"the host name is its address without kimi_address or ssh_hostname: {_ADDRESS_RULE}"
        )
    return InventoryHost(name=name, groups=groups, address=address, vars=host_vars)
