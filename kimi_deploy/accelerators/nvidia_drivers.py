"""What the drivers step makes true on an NVIDIA host, decided on the controller before any change.

Pure: from the recipe's ``drivers``, the host's place in the plan and what its probe found
(``hostside/driver_probe.py``), it decides the apt repository, the pinning package, the driver set
with the fabric manager and IMEX its hardware needs, the holds, the IMEX node list and whether the
host must reboot into the driver. What would leave a host inconsistent is refused before any
change, each refusal one line ``HOST: drivers: WHAT: expected ..., found ...``.

Package names are those of NVIDIA's CUDA repository for the host's OS (the NVIDIA Driver
Installation Guide, "Debian": compute-only ``nvidia-driver-cuda`` with ``nvidia-kernel-open-dkms``
or ``nvidia-kernel-dkms``; "Ubuntu": compute-only ``libnvidia-compute`` with ``nvidia-dkms-open`` or
``nvidia-dkms``, named by branch up to 580; full ``nvidia-open`` or ``cuda-drivers`` on both;
``nvidia-driver-pinning-<branch>`` or ``-<version>`` before the driver, "Version locking").
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kimi_deploy.accelerators.interface import DriversPlan, DriversStep
from kimi_deploy.hostside.probe_types import InstalledPackage
from kimi_deploy.hostside.requests import DriversRequest
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import NvidiaDriver, Recipe
from kimi_deploy.render.files import RenderedFile

NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos"
REBOOT_FLAG = "--data kimi_reboot=allowed"
FABRIC_MANAGER = "nvidia-fabricmanager"
IMEX = "nvidia-imex"
IMEX_NODES = "/etc/nvidia-imex/nodes_config.cfg"
# IMEX channels are not created by default, and CUDA's fabric memory calls across trays need one:
# the nvidia module creates /dev/nvidia-caps-imex-channels/channel0 when loaded with this option
# (NVIDIA IMEX guide, "IMEX Channels": https://docs.nvidia.com/multi-node-nvlink-systems/imex-guide/imexchannels.html).
IMEX_CHANNEL_CONF = "/etc/modprobe.d/nvidia-imex-channel.conf"
IMEX_CHANNEL_OPTION = "options nvidia NVreg_CreateImexChannel0=1"
# The channel's device node, made as nvidia-modprobe makes it (NVIDIA/nvidia-modprobe
# modprobe-utils/nvidia-modprobe-utils.c:1063, nvidia_cap_imex_channel_mknod: the major of
# nvidia-caps-imex-channels in /proc/devices, the channel as minor; 0666, nvidia-modprobe's default
# device file mode) and the IMEX guide's manual way, at every boot (/dev is made anew) and now: a
# driver loaded before the option was written makes no channel of its own until it loads again.
IMEX_CHANNEL_UNIT = "nvidia-imex-channel"
IMEX_CHANNEL_UNIT_FILE = f"/etc/systemd/system/{IMEX_CHANNEL_UNIT}.service"
IMEX_CHANNEL_DEVICE = "/dev/nvidia-caps-imex-channels/channel0"
PIN_PREFIX = "nvidia-driver-pinning-"
KEYRING = "cuda-keyring"
# Debian's architecture -> the directory NVIDIA's repository keeps it in.
REPO_ARCHES = {"amd64": "x86_64", "arm64": "sbsa"}
# Ubuntu releases (os-release VERSION_ID) -> NVIDIA's tree for them; Debian's is debian<major>.
UBUNTU_TREES = {"22.04": "ubuntu2204", "24.04": "ubuntu2404"}
# From this branch on, Ubuntu's tree names the compute-only packages without the branch:
# ``libnvidia-compute nvidia-dkms-open`` (590, 595, 610), ``libnvidia-compute-580
# nvidia-dkms-580-open`` before (installs from NVIDIA's ubuntu2204 and ubuntu2404 trees as users
# report them; the guide's "Ubuntu" section names the unsuffixed ones).
UBUNTU_UNSUFFIXED_FROM = 590
# Baseboards whose GPUs meet in NVSwitches when a host carries eight of them (HGX); a board with
# fewer (HGX H100 4-GPU, PCIe cards) links its GPUs directly and runs no fabric manager.
HGX_MODELS = ("A100", "H100", "H200", "B200", "B300")
HGX_GPUS = 8
# Grace Blackwell trays: their GPUs reach the NVLink switch trays of the rack (GB200/GB300 NVL),
# whose own OS (NVOS) runs the fabric manager and the NVLink subnet manager. A compute tray has no
# NVSwitch: nv-fabricmanager there exits with NV_WARN_NOTHING_TO_DO and its unit fails
# (NVIDIA/gpu-operator#610; https://docs.nvidia.com/multi-node-nvlink-systems/mnnvl-user-guide/overview.html:
# "NVOS software image includes the NMX-C application, the FM application, and the NVLSM
# application"); multi-node NVLink on the trays is IMEX's.
NVL_PREFIX = "GB"
# HGX boards of the NVLink 5 generation: their NVSwitches are reached through a ConnectX bridge, and
# the fabric manager's start script (nvidia-fabricmanager-start.sh) runs the NVLink subnet manager
# over InfiniBand management datagrams: it needs ``nvlsm``, ``ibstat`` (infiniband-diags) and the
# ``ib_umad`` module. NVIDIA's driver container installs ``nvlsm infiniband-diags`` unversioned and
# waits for ib_umad before starting it (NVIDIA/gpu-driver-container ubuntu24.04/install.sh:67-69,
# ubuntu24.04/nvidia-driver:169-191 and 636-648, commit 06a208ca).
NVLINK5_HGX = ("B200", "B300")
NVLSM_PACKAGES = ("nvlsm", "infiniband-diags")
NVLSM_MODULES = ("ib_umad",)
# Read by systemd-modules-load at every boot (modules-load.d(5)): the module is back after a reboot.
NVLSM_MODULES_FILE = "/etc/modules-load.d/nvidia-nvlsm.conf"

# The key DKMS signs the modules it builds with when Secure Boot is on; the firmware loads them only
# once it is enrolled (mokutil --import, confirmed at the next boot). DKMS's default is
# /var/lib/dkms/mok.pub, made at its first build when missing (dkms-project/dkms
# dkms_framework.conf.in, mok_certificate); Ubuntu's dkms signs with the shim-signed MOK
# (update-secureboot-policy --enroll-key).
DKMS_KEYS = {"debian": "/var/lib/dkms/mok.pub", "ubuntu": "/var/lib/shim-signed/mok/MOK.der"}


Reboot = Literal["no", "yes", "check"]


def upstream(deb_version: str) -> str:
    """The driver version of a Debian package version: ``580.95.05-1`` -> ``580.95.05``."""
    return deb_version.split(":", 1)[-1].rsplit("-", 1)[0]


def needs_fabric_manager(model: str, per_host: int) -> bool:
    """Hosts with NVSwitches of their own: 8-GPU HGX boards, not Grace Blackwell trays."""
    words = model.upper().replace("NVIDIA", " ").split()
    return per_host == HGX_GPUS and any(w in HGX_MODELS for w in words)


def needs_nvlsm(model: str, per_host: int) -> bool:
    """An HGX board of the NVLink 5 generation, whose fabric manager starts the NVLink subnet manager."""
    words = model.upper().replace("NVIDIA", " ").split()
    return needs_fabric_manager(model, per_host) and any(w in NVLINK5_HGX for w in words)


def needs_imex(spec: HostPlan) -> bool:
    """An engine instance spread over Grace Blackwell trays shares GPU memory over multi-node
    NVLink, which IMEX brokers."""
    return spec.role != "router" and spec.nodes > 1 and spec.accelerator_model.upper().startswith(NVL_PREFIX)


def extras_for(spec: HostPlan) -> tuple[str, ...]:
    """The services a host's driver set gets beside it: the fabric manager where the board has
    NVSwitches, IMEX on an instance over several Grace Blackwell trays."""
    fabric = (FABRIC_MANAGER,) if needs_fabric_manager(spec.accelerator_model, spec.accelerators) else ()
    return fabric + ((IMEX,) if needs_imex(spec) else ())


def host_line(recipe: Recipe, spec: HostPlan) -> str | None:
    """What the drivers step installs on an NVIDIA engine host, as ``kimi-deploy plan`` shows it
    (the host's OS and architecture pick NVIDIA's repository tree)."""
    want = recipe.drivers.nvidia
    if want is None:
        return None
    extras = extras_for(spec)
    tools = NVLSM_PACKAGES if needs_nvlsm(spec.accelerator_model, spec.accelerators) else ()
    others = "".join(f" ({arch}: {pin_package(want.for_arch(arch))})" for arch in sorted(want.per_arch))
    what = f"{spec.accelerator_model} x{spec.accelerators}: pin {pin_package(want)}{others}; packages "
    debian, ubuntu = driver_packages(want), driver_packages(want, "ubuntu2404")
    what += " ".join(debian) + (f" (Ubuntu: {' '.join(ubuntu)})" if ubuntu != debian else "")
    what += "".join(f" {name}" for name in (*extras, *tools))
    if extras:
        units = [IMEX_CHANNEL_UNIT] if IMEX in extras else []
        what += f"; services {' '.join([*units, *extras])}"
    if tools:
        what += f"; modules {' '.join(NVLSM_MODULES)} ({NVLSM_MODULES_FILE})"
    if IMEX in extras:
        what += f"; files {IMEX_NODES}, {IMEX_CHANNEL_CONF} ({IMEX_CHANNEL_OPTION}), {IMEX_CHANNEL_UNIT_FILE}"
    return what


def imex_domain(spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[HostPlan, ...]:
    """The hosts of ``spec``'s engine instance: one IMEX domain, in plan order."""
    return tuple(p for p in topology if p.pool == spec.pool and p.instance == spec.instance)


def driver_packages(want: NvidiaDriver, tree: str = "debian12") -> tuple[str, ...]:
    """The driver set in NVIDIA's repository tree ``tree`` (``debian12``, ``ubuntu2404``): the first
    package carries the driver's version."""
    if want.compute_only and tree.startswith("ubuntu"):
        suffix = f"-{want.branch}" if int(want.branch) < UBUNTU_UNSUFFIXED_FROM else ""
        return (f"libnvidia-compute{suffix}", f"nvidia-dkms{suffix}" + ("-open" if want.flavor == "open" else ""))
    if want.compute_only:
        dkms = "nvidia-kernel-open-dkms" if want.flavor == "open" else "nvidia-kernel-dkms"
        return ("nvidia-driver-cuda", dkms)
    return ("nvidia-open",) if want.flavor == "open" else ("cuda-drivers",)


def repository_tree(os_release: Mapping[str, Any]) -> str | None:
    """NVIDIA's repository tree for a host's OS (``debian12``, ``ubuntu2404``); None: none planned."""
    version = str(os_release.get("version_id") or "")
    if os_release.get("id") == "debian" and version:
        return f"debian{version.partition('.')[0]}"
    if os_release.get("id") == "ubuntu":
        return UBUNTU_TREES.get(version)
    return None


def pin_package(want: NvidiaDriver) -> str:
    return PIN_PREFIX + (want.version or want.branch)


def probe_request(recipe: Recipe, spec: HostPlan) -> DriversRequest:
    """What ``hostside/driver_probe.py`` reads for an NVIDIA engine host."""
    if recipe.drivers.nvidia is None:
        return {}
    files = [IMEX_NODES, IMEX_CHANNEL_CONF, IMEX_CHANNEL_UNIT_FILE, NVLSM_MODULES_FILE]
    keys = sorted(DKMS_KEYS.values())
    services = [FABRIC_MANAGER, IMEX_CHANNEL_UNIT, IMEX]
    return {"nvidia": True, "services": services, "files": files, "secure_boot": keys}


@dataclass(frozen=True)
class Repository:
    """NVIDIA's repository for the host's release: ``url`` is ``<base>/debian12/x86_64``."""

    url: str
    keyring: str  # the keyring package's file in it: cuda-keyring_1.1-1_all.deb
    present: bool  # cuda-keyring installed and an apt source pointing at ``url``
    refresh: bool  # apt must read the repository again (something will be installed)


@dataclass(frozen=True)
class Service:
    unit: str
    active: str
    enabled: str
    restart: bool  # its package or its configuration changes this run
    modules: tuple[str, ...] = ()  # kernel modules loaded before it starts (modprobe)


@dataclass(frozen=True)
class NvidiaPlan:
    repository: Repository
    pin: str
    pin_installed: bool
    packages: tuple[str, ...]  # the driver set, then the fabric manager and IMEX where needed
    install: tuple[str, ...]  # apt-get install arguments: ``name`` or ``name=version``
    unheld: tuple[str, ...]  # of ``packages``, installed but not held
    headers: str | None  # linux-headers-<kernel> for DKMS, when installing and the host lacks them
    target: str | None  # the driver version after this run; None: the newest of the branch
    branch: str
    loaded: str | None
    reboot: Reboot
    imex_nodes: RenderedFile | None
    # fabric manager packages on a host without NVSwitch (a Grace Blackwell tray set up earlier),
    # removed before the driver set moves: their unit can only fail there
    remove: tuple[str, ...]
    # the nvidia module's options file (IMEX channel 0), written before the driver is installed
    module_options: RenderedFile | None
    # the unit making IMEX channel 0's device node, at every boot and now
    imex_channel: RenderedFile | None
    services: tuple[Service, ...]
    # what the fabric manager of an NVLink 5 board runs beside it: packages of their own versions
    # (installed with the driver set, not held), and the kernel modules loaded before it starts,
    # listed for every boot in ``modules_file``
    tools: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    modules_file: RenderedFile | None = None
    # No reboot allowed and apt picks the release: the install must keep this version loaded, and
    # stops with ``reboot_line`` (``{version}``: apt's candidate) before installing anything else.
    keep_loaded: str | None = None
    reboot_line: str = ""

    @property
    def target_text(self) -> str:
        return self.target or f"{self.branch}.*"


def loaded_driver(found: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The driver version the kernel runs (its module, else what NVML reports) and NVML's error."""
    nvml = found.get("nvml") or {}
    return found.get("module") or nvml.get("version"), nvml.get("error")


def reboot_reason(found: Mapping[str, Any], driver_package: str) -> str | None:
    """Why the host must reboot to run its installed driver (None: it runs it, NVML agrees)."""
    package = (found.get("packages") or {}).get(driver_package)
    if package is None:
        return None
    installed = upstream(package["version"])
    loaded, error = loaded_driver(found)
    if error:
        return f"driver {installed} is installed, NVML says: {error}"
    if loaded != installed:
        return f"driver {installed} is installed, {loaded or 'none'} is loaded"
    return None


def reboot_refusal(host: str, what: str, found: Mapping[str, Any]) -> str:
    """The line that stops a host needing a reboot the run may not make."""
    loaded, error = loaded_driver(found)
    now = f"NVML says: {error}" if error else f"{loaded or 'no driver'} is loaded"
    return f"{host}: drivers: a reboot is needed to load driver {what} ({now}); allow it with {REBOOT_FLAG}"


def _repository(host: str, base: str, want: NvidiaDriver, found: Mapping[str, Any]) -> Repository | str:
    os_ = found.get("os") or {}
    tree = repository_tree(os_)
    if tree is None:
        planned, found_os = f"Debian and Ubuntu {', '.join(UBUNTU_TREES)}", os_.get("pretty") or os_.get("id")
        return f"{host}: drivers: NVIDIA's packages are planned for {planned}, found {found_os}"
    arch = os_.get("arch")
    if arch not in REPO_ARCHES:
        return f"{host}: drivers: NVIDIA's repository has {', '.join(REPO_ARCHES)} packages, found {arch}"
    url = f"{base.rstrip('/')}/{tree}/{REPO_ARCHES[arch]}"
    sources = [line.split() for line in found.get("sources") or []]
    present = KEYRING in (found.get("packages") or {}) and any(url in words or f"{url}/" in words for words in sources)
    return Repository(url, f"{KEYRING}_{want.keyring}_all.deb", present, refresh=False)


def secure_boot_refusal(host: str, tree: str, found: Mapping[str, Any]) -> str | None:
    """The line stopping a host whose firmware would refuse the module DKMS is about to build:
    Secure Boot on and DKMS's signing key not enrolled (None: nothing stands in the way)."""
    state = found.get("secure_boot") or {}
    if state.get("enabled") is not True:
        return None
    key = DKMS_KEYS["ubuntu" if tree.startswith("ubuntu") else "debian"]
    said = (state.get("keys") or {}).get(key) or "not checked"
    if said == "enrolled":
        return None
    make = "make it with `dkms generate_mok`, " if said == "missing" else ""
    if said not in ("missing", "not enrolled"):
        said = f"not known to be enrolled ({said.removeprefix('unknown: ')})"
    return (
        f"{host}: drivers: Secure Boot is on and the DKMS signing key {key} is {said}: the NVIDIA module "
        f"built now would not load; {make}import it with `mokutil --import {key}`, enroll it at the next boot, "
        "then run again (or turn Secure Boot off)"
    )


def _imex_refusal(spec: HostPlan, topology: tuple[HostPlan, ...]) -> str | None:
    """Why the IMEX domain of ``spec``'s instance has no node list: a host whose address is no IP address."""
    for peer in imex_domain(spec, topology):
        try:
            ipaddress.ip_address(peer.address)
        except ValueError:
            return (
                f"{spec.host}: drivers: IMEX lists IP addresses in {IMEX_NODES}, "
                f"found {peer.address!r} for host {peer.host}: set its kimi_address"
            )
    return None


def _imex_nodes(spec: HostPlan, topology: tuple[HostPlan, ...]) -> RenderedFile:
    why = f"# The IMEX domain of {spec.topology} pool {spec.pool} instance {spec.instance}, from the plan.\n"
    return RenderedFile(IMEX_NODES, why + "".join(f"{p.address}\n" for p in imex_domain(spec, topology)), 0o644, "root")


def _nvlsm_modules() -> RenderedFile:
    why = "# Kernel modules the NVLink subnet manager needs, loaded at every boot; from kimi-deploy.\n"
    return RenderedFile(NVLSM_MODULES_FILE, why + "".join(f"{m}\n" for m in NVLSM_MODULES), 0o644, "root")


def _imex_channel_unit() -> RenderedFile:
    folder = IMEX_CHANNEL_DEVICE.rsplit("/", 1)[0]
    # systemd reads "$$" as "$" (systemd.service(5), "Command lines"); no backslash and no single
    # quote inside the single-quoted script, so systemd hands sh the script as written.
    script = (
        'm=; while read -r n d; do [ "$$d" = nvidia-caps-imex-channels ] && m=$$n; done < /proc/devices; '
        '[ -n "$$m" ] || { echo "no nvidia-caps-imex-channels in /proc/devices: the nvidia module is not loaded" '
        f">&2; exit 1; }}; mkdir -p {folder} && {{ [ -c {IMEX_CHANNEL_DEVICE} ] || "
        f'mknod -m 0666 {IMEX_CHANNEL_DEVICE} c "$$m" 0; }}'
    )
    unit = f"""\
# From kimi-deploy: IMEX channel 0, which CUDA's fabric memory calls across trays open.
[Unit]
Description=IMEX channel 0 for CUDA's fabric memory across trays
Before=nvidia-imex.service

[Service]
Type=oneshot
RemainAfterExit=yes
# The module (with its channel option) when udev has not loaded it yet.
ExecStartPre=-/sbin/modprobe nvidia
ExecStart=/bin/sh -c '{script}'

[Install]
WantedBy=multi-user.target
"""
    return RenderedFile(IMEX_CHANNEL_UNIT_FILE, unit, 0o644, "root")


def _imex_channel() -> RenderedFile:
    why = "# IMEX channel 0 for CUDA's fabric memory across trays, from kimi-deploy; read when nvidia loads.\n"
    return RenderedFile(IMEX_CHANNEL_CONF, why + IMEX_CHANNEL_OPTION + "\n", 0o644, "root")


def nvidia_files(spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[RenderedFile, ...]:
    """Every file the drivers step writes on an NVIDIA engine host (``spec``; ``topology``: the
    plans of its topology), in the order it writes them: the nvidia module's options, the NVLink
    subnet manager's modules, the IMEX node list and the IMEX channel's unit, each where the host
    needs it. None depends on what the host's probe finds. An IMEX domain with a host whose
    address is no IP address gets no node list and no channel: the step refuses its hosts."""
    imex = IMEX in extras_for(spec) and _imex_refusal(spec, topology) is None
    nvlsm = needs_nvlsm(spec.accelerator_model, spec.accelerators)
    return (
        *((_imex_channel(),) if imex else ()),
        *((_nvlsm_modules(),) if nvlsm else ()),
        *((_imex_nodes(spec, topology), _imex_channel_unit()) if imex else ()),
    )


def driver_files(recipe: Recipe, spec: HostPlan, topology: tuple[HostPlan, ...]) -> tuple[RenderedFile, ...]:
    """``nvidia_files`` of a host whose recipe installs an NVIDIA driver (``drivers.nvidia``); none otherwise."""
    return nvidia_files(spec, topology) if recipe.drivers.nvidia is not None else ()


def _foreign(
    host: str, managed: tuple[str, ...], target: str | None, branch: str, found: Mapping[str, Any]
) -> str | None:
    """A fabric manager or IMEX package this plan leaves as it is, at another version than the driver."""
    for name, package in sorted((found.get("packages") or {}).items()):
        kind = "fabric manager" if name.startswith(FABRIC_MANAGER) else "IMEX" if name.startswith(IMEX) else None
        if kind is None or name in managed or (kind == "fabric manager" and FABRIC_MANAGER not in managed):
            continue  # a fabric manager where none belongs is removed, whatever its version
        if target is None or upstream(package["version"]) != target:
            expected = target or f"the newest {branch} driver (pin drivers.nvidia.version to choose)"
            return (
                f"{host}: drivers: {kind} {name} would not match the driver: "
                f"expected {expected}, found {package['version']}"
            )
    return None


def plan_nvidia(
    want: NvidiaDriver,
    spec: HostPlan,
    topology: tuple[HostPlan, ...],
    found: Mapping[str, Any],
    repo_url: str,
) -> NvidiaPlan | str:
    """The NVIDIA plan of one host, or the line refusing it."""
    host = spec.host
    want = want.for_arch((found.get("os") or {}).get("arch"))
    repository = _repository(host, repo_url, want, found)
    if isinstance(repository, str):
        return repository
    tree = repository_tree(found.get("os") or {}) or "debian12"
    driver = driver_packages(want, tree)
    extras = extras_for(spec)
    if IMEX in extras and (refused_nodes := _imex_refusal(spec, topology)) is not None:
        return refused_nodes
    # what the step writes, as ``kimi-deploy plan --render`` shows it (``nvidia_files``)
    written = {f.path: f for f in nvidia_files(spec, topology)}
    imex_nodes = written.get(IMEX_NODES)
    managed = driver + extras
    installed: dict[str, InstalledPackage] = found.get("packages") or {}

    def version_of(name: str) -> str | None:
        return upstream(installed[name]["version"]) if name in installed else None

    current = version_of(driver[0])
    if want.version is not None:
        target: str | None = want.version
    elif current is not None and current.split(".", 1)[0] == want.branch:
        target = current  # a branch pin keeps the release installed on it
    else:
        target = None
    refused = _foreign(host, managed, target, want.branch, found)
    if refused:
        return refused
    stale = tuple(n for n in managed if target is None or version_of(n) != target)
    if stale and want.version is None and target is not None:
        # The branch pin alone would let apt take the newest release: name the installed one.
        install = tuple(f"{n}={installed[driver[0]]['version']}" for n in stale)
    else:
        install = stale
    nvlsm = needs_nvlsm(spec.accelerator_model, spec.accelerators)
    tools = NVLSM_PACKAGES if nvlsm else ()
    modules_file = written.get(NVLSM_MODULES_FILE)
    missing_tools = tuple(n for n in tools if n not in installed)
    install += missing_tools
    pin = pin_package(want)
    changes_driver = any(n in stale for n in driver)
    if changes_driver:
        blocked = secure_boot_refusal(host, tree, found)
        if blocked:
            return blocked
    loaded, error = loaded_driver(found)
    reboot: Reboot
    if not changes_driver:
        reboot = "yes" if reboot_reason(found, driver[0]) else "no"
    elif target is not None and loaded == target and not error:
        reboot = "no"
    elif target is None and loaded is not None and loaded.split(".", 1)[0] == want.branch and not error:
        reboot = "check"  # apt picks the release: whether it is the loaded one shows after the install
    else:
        reboot = "yes"
    services = []
    channel = written.get(IMEX_CHANNEL_UNIT_FILE)
    if channel is not None:
        state = (found.get("services") or {}).get(IMEX_CHANNEL_UNIT) or {}
        restart = reboot != "yes" and _changed(channel, found)
        services.append(Service(IMEX_CHANNEL_UNIT, state.get("active", ""), state.get("enabled", ""), restart=restart))
    for unit in extras:
        state = (found.get("services") or {}).get(unit) or {}
        nodes_changed = unit == IMEX and imex_nodes is not None and _changed(imex_nodes, found)
        # the subnet manager's tools or modules change under a running fabric manager: it restarts
        fabric_changed = unit == FABRIC_MANAGER and (
            bool(missing_tools) or (modules_file is not None and _changed(modules_file, found))
        )
        services.append(
            Service(
                unit,
                state.get("active", ""),
                state.get("enabled", ""),
                restart=reboot != "yes" and (unit in stale or nodes_changed or fabric_changed),
                modules=NVLSM_MODULES if unit == FABRIC_MANAGER and nvlsm else (),
            )
        )
    pin_installed = pin in installed
    return NvidiaPlan(
        repository=Repository(
            repository.url, repository.keyring, repository.present, refresh=bool(install) or not pin_installed
        ),
        pin=pin,
        pin_installed=pin_installed,
        packages=managed,
        install=install,
        unheld=tuple(n for n in managed if n in installed and not installed[n].get("held")),
        headers=f"linux-headers-{found.get('kernel')}" if changes_driver and not found.get("headers") else None,
        target=target,
        branch=want.branch,
        loaded=loaded,
        reboot=reboot,
        imex_nodes=imex_nodes,
        remove=() if FABRIC_MANAGER in extras else tuple(sorted(n for n in installed if n.startswith(FABRIC_MANAGER))),
        module_options=written.get(IMEX_CHANNEL_CONF),
        imex_channel=channel,
        services=tuple(services),
        tools=tools,
        modules=NVLSM_MODULES if nvlsm else (),
        modules_file=modules_file,
    )


def _changed(f: RenderedFile, found: Mapping[str, Any]) -> bool:
    return bool((found.get("files") or {}).get(f.path) != f.sha256)


def plan_drivers(step: DriversStep) -> DriversPlan:
    """The drivers step of an NVIDIA engine host (``step.found``: its probe answer for ``probe_request``)."""
    host = step.spec.host
    want = step.recipe.drivers.nvidia
    if want is None:
        return DriversPlan(host, ())
    nvidia = plan_nvidia(want, step.spec, step.topology, step.found, step.repo_url or NVIDIA_REPO)
    if isinstance(nvidia, str):
        return DriversPlan(host, (nvidia,))
    if step.reboot_allowed or nvidia.reboot == "no":
        return DriversPlan(host, (), nvidia)
    if nvidia.reboot == "yes":
        return DriversPlan(host, (reboot_refusal(host, nvidia.target_text, step.found),), nvidia)
    line = reboot_refusal(host, "{version}", step.found)
    return DriversPlan(host, (), dataclasses.replace(nvidia, keep_loaded=nvidia.loaded, reboot_line=line))
