"""What kimi-deploy knows of a kind of accelerator, behind one interface: one module per kind
(``kimi_deploy/accelerators/<kind>.py``) gives an ``AcceleratorKind``, and the registry finds it by
the name a recipe's ``accelerators.vendor`` uses (``kimi_deploy.accelerators.accelerator``).

The recipe's rules, the host profile, the preflight gate, the units' environment, the drivers
step, the watchdog and the benchmark ask the kind; none of them compares a vendor's name
(``tests/test_kinds_and_engines.py`` holds that). A field left at its default is what a kind with
nothing special does: its engines count one device per accelerator, need no driver step, and the
preflight compares the count and the model the host reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the schema and the plan use the kinds: their types only, at run time nothing
    from kimi_deploy.accelerators.nvidia_drivers import NvidiaPlan
    from kimi_deploy.host.profile_types import Accelerators, HostProfile
    from kimi_deploy.hostside.requests import DriversRequest, WatchedDevices
    from kimi_deploy.plan.servespec import HostPlan
    from kimi_deploy.recipe import Recipe
    from kimi_deploy.render.files import RenderedFile

_TOKEN = re.compile(r"[a-z0-9.]+")
GIB = 2**30


def size_text(n: float) -> str:
    """Sizes as operators read them: GiB, or MiB below one GiB (a small demo model)."""
    return f"{n / GIB:.0f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class SysctlPlan:
    file: RenderedFile
    values: Mapping[str, str]
    current: Mapping[str, str | None]  # the running kernel's values


@dataclass(frozen=True)
class DriversStep:
    """What a kind plans one host's drivers step from."""

    recipe: Recipe
    spec: HostPlan
    topology: tuple[HostPlan, ...]  # the plans of the host's topology
    found: Mapping[str, Any]  # the probe's answer to the kind's ``drivers_request``
    repo_url: str | None  # the driver repository, where the run names its own
    reboot_allowed: bool


@dataclass(frozen=True)
class DriversPlan:
    """The drivers step of one host: its refusals, or what each kind's operations make true."""

    host: str
    refusals: tuple[str, ...]
    nvidia: NvidiaPlan | None = None
    sysctl: SysctlPlan | None = None


def matches_words(profile_model: str | None, wanted: str) -> bool:
    """Whether a reported model is the ``wanted`` one, case-insensitive and by whole words:
    "NVIDIA B300 SXM6 AC" is "B300" (and "NVIDIA B300") but not "GB300"."""
    if not profile_model or not wanted.strip():
        return False
    have, want = _TOKEN.findall(profile_model.lower()), _TOKEN.findall(wanted.lower())
    return any(have[i : i + len(want)] == want for i in range(len(have) - len(want) + 1))


def _no_rule(recipe: Recipe, topology: str) -> str | None:
    return None


def _one(model: str | None) -> int:
    return 1


def _x86(model: str | None) -> str:
    return "x86_64"


def _model(model: str | None) -> str:
    return model or ""


def _none(sections: Mapping[str, Mapping[str, Any]], errors: dict[str, str]) -> Accelerators | None:
    return None


def _no_watch(spec: HostPlan) -> WatchedDevices:
    return {"accelerators": None, "kmsg": None}


def _no_request(recipe: Recipe, spec: HostPlan) -> DriversRequest:
    return {}


def _no_drivers(step: DriversStep) -> DriversPlan:
    return DriversPlan(step.spec.host, ())


def _no_files(recipe: Recipe, spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[RenderedFile, ...]:
    return ()


def _no_line(recipe: Recipe, spec: HostPlan) -> str | None:
    return None


def _gib(mib: Any) -> str:
    return f" ({mib // 1024} GiB)" if isinstance(mib, int) and mib else ""


def devices_gate(kind: AcceleratorKind, spec: HostPlan, profile: HostProfile) -> str | None:
    """The preflight of a kind whose devices the probe counts: the count and the model the plan
    gives the host, and each device's memory where the kind reports it (``memory_reported``)."""
    acc = profile["accelerators"]
    want = (
        f"pool {spec.pool} needs {spec.accelerators} x {spec.accelerator_model} "
        f"with >= {spec.accelerator_memory_gib} GiB"
    )
    if acc.get("error"):
        return f"accelerators: {want}, found an error: {acc['error']}"
    count = int(acc.get("count") or 0)
    model = acc.get("model") or "none"
    memory_mib = acc.get("memory_mib")
    found = f"{count} x {model}{_gib(memory_mib)}"
    if acc.get("vendor") != kind.name or count != spec.accelerators:
        return f"accelerators: {want}, found {found}"
    if not kind.matches_model(str(model), spec.accelerator_model):
        return f"accelerators: {want}, found {found}"
    if kind.memory_reported and (memory_mib or 0) < spec.accelerator_memory_gib * 1024:
        return f"accelerators: {want}, found {found}"
    return None


@dataclass(frozen=True)
class AcceleratorKind:
    # the name a recipe's ``accelerators.vendor`` uses, and the host profile's ``vendor``
    name: str
    # the recipe must name the model (``accelerators.model``: B300, TPU7x)
    model_required: bool = True
    # its engines run on the host's own CPUs: the topology's ``cpu`` settings apply, and only an
    # engine with a CPU build (``Engine.cpu_build``) serves it
    host_cpus: bool = False
    # why prefill/decode pools cannot move KV cache between its hosts; None: they can
    no_kv_transfer: str | None = None
    # its engines meet through torch.distributed's Gloo (its socket interface is set in the units);
    # False: through a runtime of their own (JAX's coordinator)
    gloo: bool = False
    # its collectives are NCCL's: the units set NCCL's interfaces, the all-reduce check may use nccl
    nccl: bool = False
    # the preflight compares each device's memory with the recipe's ``memory_gib``
    memory_reported: bool = False
    # the watchdog asks the devices' health (nvidia-smi's ECC counts, the driver's Xid events in
    # the kernel's log) and the benchmark samples their use while it runs
    device_health: bool = False
    # (recipe, topology name) -> what the recipe lacks to serve that topology on this kind, one line
    # shown under ``topologies.NAME.accelerators``
    recipe_rule: Callable[[Recipe, str], str | None] = _no_rule
    # accelerators.model -> the devices its engines' runtime counts on one accelerator
    devices_per_accelerator: Callable[[str | None], int] = _one
    # accelerators.model -> the hosts' CPU architecture, where the recipe names none
    machine: Callable[[str | None], str] = _x86
    # the benchmark's cost counts the engine hosts, not their accelerators
    priced_by_host: bool = False
    # accelerators.model -> the name ``benchmark.cost.accelerator_hour`` prices it under
    price_name: Callable[[str | None], str] = _model
    # the sections of the hardware probe's answer (``hostside/hardware_probe.py``) it reads
    probe_sections: tuple[str, ...] = ()
    # the hardware probe's sections (``hostside/hardware_probe.py``) -> the profile's accelerators,
    # None: the host has none of this kind (``errors`` takes what could not be read, by section)
    read_profile: Callable[[Mapping[str, Mapping[str, Any]], dict[str, str]], Accelerators | None] = _none
    # (the model the profile reports, the recipe's) -> whether they are one model
    matches_model: Callable[[str | None, str], bool] = matches_words
    # (host plan, host profile) -> the preflight's line, None: the host may serve
    preflight: Callable[[AcceleratorKind, HostPlan, HostProfile], str | None] = devices_gate
    # what the drivers step asks ``hostside/driver_probe.py`` on an engine host
    drivers_request: Callable[[Recipe, HostPlan], DriversRequest] = _no_request
    # the drivers step of an engine host
    plan_drivers: Callable[[DriversStep], DriversPlan] = _no_drivers
    # (recipe, host plan, its topology's plans) -> every file the drivers step writes on an engine
    # host, whatever its probe finds: ``plan_drivers`` takes them from here, and so does
    # ``kimi-deploy plan --render``
    driver_files: Callable[[Recipe, HostPlan, tuple[HostPlan, ...]], tuple[RenderedFile, ...]] = _no_files
    # what the drivers step installs on an engine host, as ``kimi-deploy plan`` shows it
    driver_line: Callable[[Recipe, HostPlan], str | None] = _no_line

    def check_host(self, spec: HostPlan, profile: HostProfile) -> str | None:
        """The preflight's accelerators line for an engine host of this kind, None: it may serve."""
        return self.preflight(self, spec, profile)

    def watchdog(self, spec: HostPlan) -> WatchedDevices:
        """What the watchdog reads of the host's devices (``hostside/watchdog.py``'s config)."""
        if not self.device_health:
            return _no_watch(spec)
        return {"accelerators": {"vendor": self.name, "count": spec.accelerators}, "kmsg": "/dev/kmsg"}
