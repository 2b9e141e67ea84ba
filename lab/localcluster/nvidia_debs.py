"""Stand-in NVIDIA driver packages, built with ``dpkg-deb`` under the names NVIDIA's apt repository uses.

What is mirrored: NVIDIA's CUDA network repository for Debian 12
(``https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/``, one flat ``/``
suite), as the NVIDIA Driver Installation Guide (docs.nvidia.com/datacenter/tesla/
driver-installation-guide: "Debian", "Compute-only and Desktop Installation", "Version locking")
describes it:

- ``cuda-keyring`` 1.1-1 (all) installs the repository's signing key as
  ``/usr/share/keyrings/cuda-archive-keyring.gpg``, the source
  ``/etc/apt/sources.list.d/cuda-debian12-x86_64.list``
  (``deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] <repo>/debian12/x86_64/ /``) and
  ``/etc/apt/preferences.d/cuda-repository-pin-600`` (the repository's packages at priority 600).
  It is the one package installed with ``dpkg -i``, fetched from the repository directory itself.
- ``nvidia-driver-pinning-<branch>`` ("APT driver pinning file for driver branch 580", version
  ``580-1``) and ``nvidia-driver-pinning-<version>`` ("... for driver version 580.95.05", version
  ``580.95.05-1``): an apt preferences file that puts the branch's (or the version's) driver
  packages at priority 1000, which also lets apt downgrade to them. They all ``Provide``,
  ``Conflict`` with and ``Replace`` ``nvidia-driver-pinning``, so installing one removes the other:
  switching a pin is ``apt-get install nvidia-driver-pinning-<new>``. The guide asks for the pin
  before the driver.
- The driver, per version ``V`` (package version ``V-1``), with Debian's names in that repository:
  ``nvidia-kernel-common`` (module support files), ``nvidia-kernel-open-dkms`` (the open kernel
  modules, built by DKMS, loaded at the next boot), ``nvidia-driver-cuda`` (the compute userspace:
  libcuda, NVML, ``nvidia-smi``) and the metapackage ``nvidia-open``. The guide's compute-only
  ("headless") install on Debian is ``apt-get install nvidia-driver-cuda nvidia-kernel-open-dkms``;
  its full install is ``apt-get install nvidia-open``. Every piece depends on the others at exactly
  ``V-1``, so apt moves them together.
- ``nvidia-fabricmanager`` (NVSwitch systems: HGX B300/H200; unit ``nvidia-fabricmanager.service``
  running ``nvidia-fabricmanager-start.sh --mode precheck`` then ``--mode start``, config
  ``/usr/share/nvidia/nvswitch/fabricmanager.cfg``; on a host without NVSwitches the daemon exits
  with NV_WARN_NOTHING_TO_DO, NVIDIA/gpu-operator#610; on an NVLink 5 board the start script needs
  ``nvlsm``, ``ibstat`` and ``ib_umad``, see ``standins/nvidia_fabricmanager_start.sh``) and
  ``nvidia-imex`` (NVLink domains such as GB300 NVL72; unit ``nvidia-imex.service``, ``/etc/nvidia-imex/config.cfg`` and
  ``nodes_config.cfg``), at version ``V-1`` too. Both depend on the driver at exactly ``V-1``: the
  real fabric manager refuses a driver of another version, so apt refuses to install one.

Ubuntu's repository has the same structure under other names (``libnvidia-compute`` and
``nvidia-dkms-open`` for compute-only from branch 590, ``-580`` suffixed names before it); the hosts
are Debian 12, so Debian's names are the ones built. Left out as beside the point here: the
desktop half (``nvidia-driver``, X and GL libraries), the proprietary modules (``cuda-drivers``,
``nvidia-kernel-dkms``), ``dkms`` itself and the library packages ``nvidia-driver-cuda`` pulls in.
The versions are real releases: 580.95.05 and 580.105.08 (branch 580) and 590.48.01 (branch 590).
``nvlsm`` (the NVLink subnet manager, ``Depends: libibumad3``, installed with ``infiniband-diags``
from Debian, as NVIDIA's driver container does: gpu-driver-container ubuntu24.04/install.sh:67-69,
commit 06a208ca) is one package of its own version.

What a stand-in does: maintainer scripts (shell) call ``/usr/lib/nvidia/standin-driver-state``
(``standins/nvidia_driver_state.py``), which keeps ``/etc/kimi-fake-accelerators.json`` as a real
driver would leave the machine: new userspace at once, new kernel module at the next boot (the
oneshot ``nvidia-standin-boot.service``), "Driver/library version mismatch" from nvidia-smi in
between, and ``/run/reboot-required`` (with ``reboot-required.pkgs``) whenever a boot is needed.
The fabric manager and IMEX daemons are shell stand-ins that check the driver version like the
real ones. Packages are reproducible: the same inputs give the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from localcluster import run
from localcluster.host_root import early_boot_unit

DRIVER_VERSIONS = ("580.95.05", "580.105.08", "590.48.01")
# nvlsm is released on its own calendar (2025.06.5 .. 2025.12.211 in NVIDIA's trees).
NVLSM_VERSION = "2025.06.5-1"
# The configuration NVIDIA's driver container hands the start script (gpu-driver-container,
# ubuntu24.04/nvidia-driver:641, commit 06a208ca).
NVLSM_CONF = "usr/share/nvidia/nvlsm/nvlsm.conf"
# Where nvlsm is installed (aws/aws-parallelcluster-cookbook, commit 02106c37, cookbooks/
# aws-parallelcluster-platform/resources/nvidia_nvlsm/partial/_nvidia_nvlsm_common.rb: nvlsm_installed?).
NVLSM_BINARY = "opt/nvidia/nvlsm/sbin/nvlsm"
KEYRING_VERSION = "1.1-1"
# Each driver package's version is the driver version with this Debian revision.
DEBIAN_REVISION = "1"
UBUNTU_REVISION = "1ubuntu1"
UBUNTU_UNSUFFIXED_FROM = 590
MAINTAINER = "kimi-deploy local test cluster <kimi-cluster@localhost>"
SECTION = "NVIDIA"
# Every file and archive member carries this time (2025-01-01 UTC): a rebuild gives the same bytes.
SOURCE_DATE_EPOCH = 1735689600
STANDINS = Path(__file__).resolve().parent / "standins"
KEYRING_FILE = "usr/share/keyrings/cuda-archive-keyring.gpg"
STATE_HELPER = "usr/lib/nvidia/standin-driver-state"
BOOT_UNIT = "nvidia-standin-boot.service"
UNIT_DIR = "lib/systemd/system"
# The packages whose version is the driver's: what a pinning package pins.
DRIVER_PACKAGES = (
    "nvidia-driver-cuda",
    "nvidia-fabricmanager",
    "nvidia-imex",
    "nvidia-kernel-common",
    "nvidia-kernel-open-dkms",
    "nvidia-open",
)


@dataclasses.dataclass(frozen=True)
class Repository:
    """The repository the packages go into, as ``cuda-keyring`` points a host at it."""

    url: str  # the flat repository itself: http://10.213.7.1:8767/compute/cuda/repos/debian12/x86_64/
    distro: str  # NVIDIA's name for the distribution release: debian12
    architecture: str  # Debian's name for the packages' architecture: amd64
    arch_dir: str  # NVIDIA's name for it in repository paths: x86_64
    public_key: bytes  # the signing key, a binary OpenPGP keyring


@dataclasses.dataclass(frozen=True)
class File:
    """One entry of a package's data: bytes and mode, or a symbolic link to ``link``."""

    data: bytes = b""
    mode: int = 0o644
    link: str | None = None


@dataclasses.dataclass(frozen=True)
class Deb:
    """A binary package: its control fields, files (path without the leading /) and maintainer scripts."""

    package: str
    version: str
    architecture: str
    summary: str
    description: str
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    replaces: tuple[str, ...] = ()
    files: dict[str, File] = dataclasses.field(default_factory=dict)
    conffiles: tuple[str, ...] = ()
    scripts: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def filename(self) -> str:
        return f"{self.package}_{self.version.split(':')[-1]}_{self.architecture}.deb"

    def control(self) -> str:
        size = sum(-(-len(f.data) // 1024) for f in self.files.values() if f.link is None) or 1
        fields = [
            ("Package", self.package),
            ("Version", self.version),
            ("Architecture", self.architecture),
            ("Maintainer", MAINTAINER),
            ("Installed-Size", str(size)),
            ("Depends", ", ".join(self.depends)),
            ("Provides", ", ".join(self.provides)),
            ("Conflicts", ", ".join(self.conflicts)),
            ("Replaces", ", ".join(self.replaces)),
            ("Section", SECTION),
            ("Priority", "optional"),
            ("Homepage", "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/"),
        ]
        body = "".join(f"{name}: {value}\n" for name, value in fields if value)
        long = "\n".join(f" {line}" if line else " ." for line in self.description.strip().splitlines())
        return f"{body}Description: {self.summary}\n{long}\n"


@dataclasses.dataclass(frozen=True)
class Names:
    """One driver version's package names and Debian revision in one of NVIDIA's trees."""

    compute: str  # the compute userspace: nvidia-driver-cuda; Ubuntu: libnvidia-compute[-580]
    dkms: str  # the open kernel modules: nvidia-kernel-open-dkms; Ubuntu: nvidia-dkms[-580]-open
    proprietary: str  # what the open modules conflict with: nvidia-kernel-dkms; Ubuntu: nvidia-dkms[-580]
    common: str  # module support files: nvidia-kernel-common; Ubuntu: nvidia-kernel-common[-580]
    revision: str  # 1; Ubuntu: 1ubuntu1


def names(distro: str, driver: str) -> Names:
    """The names in tree ``distro`` (``debian12``, ``ubuntu2404``): Ubuntu's tree names the compute
    packages by branch up to 580 and not from 590 (``libnvidia-compute-580 nvidia-dkms-580-open``,
    ``libnvidia-compute nvidia-dkms-open``: NVIDIA Driver Installation Guide, "Ubuntu", and installs
    from NVIDIA's ubuntu2204 tree), with ``-1ubuntu1`` revisions (its pinning packages, e.g.
    ``nvidia-driver-pinning-595.71.05 595.71.05-1ubuntu1``)."""
    if not distro.startswith("ubuntu"):
        return Names(
            "nvidia-driver-cuda",
            "nvidia-kernel-open-dkms",
            "nvidia-kernel-dkms",
            "nvidia-kernel-common",
            DEBIAN_REVISION,
        )
    branch = branch_of(driver)
    suffix = f"-{branch}" if int(branch) < UBUNTU_UNSUFFIXED_FROM else ""
    return Names(
        f"libnvidia-compute{suffix}",
        f"nvidia-dkms{suffix}-open",
        f"nvidia-dkms{suffix}",
        f"nvidia-kernel-common{suffix}",
        UBUNTU_REVISION,
    )


def deb_version(driver: str, distro: str = "debian12") -> str:
    return f"{driver}-{names(distro, driver).revision}"


def branch_of(driver: str) -> str:
    return driver.split(".", 1)[0]


def _script(body: str) -> str:
    return f"#!/bin/sh\nset -e\n{body.strip()}\n\nexit 0\n"


_RELOAD = "if [ -d /run/systemd/system ]; then systemctl --system daemon-reload >/dev/null || true; fi\n"
_STANDIN_NOTE = (
    "Stand-in built by the kimi-deploy local test cluster: same name, version and\n"
    "dependencies as NVIDIA's package, none of its code."
)


def _standin(name: str, version: str, mode: int = 0o755) -> File:
    text = (STANDINS / name).read_text(encoding="utf-8").replace("@VERSION@", version)
    return File(text.encode(), mode)


def _unit(text: str) -> File:
    return File(text.encode())


def driver_debs(driver: str, architecture: str, distro: str = "debian12") -> list[Deb]:
    """The driver packages of one driver version in tree ``distro`` (see the module docstring)."""
    version = deb_version(driver, distro)
    n = names(distro, driver)
    exact = f"(= {version})"
    helper = f"/{STATE_HELPER}"

    def installed(what: str, package: str) -> dict[str, str]:
        return {
            "postinst": _script(f'if [ "$1" = configure ]; then\n    {helper} {what}-installed {driver} {package}\nfi'),
            "postrm": _script(
                f'case "$1" in\n    remove|purge)\n        if [ -x {helper} ]; then {helper} {what}-removed; fi\n'
                "        ;;\nesac"
            ),
        }

    boot_unit = early_boot_unit(
        "Load the installed NVIDIA kernel module (stand-in driver of the local test cluster)", f"{helper} boot"
    )
    # From branch 580 the unit runs NVIDIA's start script, which checks the host first (--mode
    # precheck), then starts the daemon, and on an NVLink 5 board the subnet manager beside it.
    fabricmanager_unit = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Wants=network-online.target

[Service]
User=root
PrivateTmp=false
Type=simple
TimeoutStartSec=240
ExecStartPre=/usr/bin/nvidia-fabricmanager-start.sh --mode precheck
ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start
LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""
    imex_unit = """\
[Unit]
Description=NVIDIA IMEX service
After=network-online.target
Wants=network-online.target

[Service]
User=root
PrivateTmp=false
Type=simple
TimeoutStartSec=infinity
ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg
LimitCORE=infinity
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""
    fabricmanager_cfg = """\
# Fabric Manager configuration (stand-in: read, not interpreted).
LOG_LEVEL=4
LOG_FILE_NAME=/var/log/fabricmanager.log
DAEMONIZE=1
BIND_INTERFACE_IP=127.0.0.1
STARTING_TCP_PORT=16000
FABRIC_MODE=0
FABRIC_MODE_RESTART=0
"""
    imex_cfg = """\
# NVIDIA IMEX configuration.
LOG_LOCAL_FILE_NAME=/var/log/nvidia-imex.log
LOG_LEVEL=4
SERVER_PORT=50000
IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg
IMEX_WAIT_FOR_QUORUM=RECOVERY
"""
    nodes_cfg = "# The IP addresses of every node in this IMEX domain, one per line.\n"
    dkms_conf = f"""\
PACKAGE_NAME="nvidia"
PACKAGE_VERSION="{driver}"
AUTOINSTALL="yes"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/kernel/drivers/video"
"""
    reload = {"postinst": _script(_RELOAD), "postrm": _script(_RELOAD)}
    return [
        Deb(
            n.common,
            version,
            architecture,
            "NVIDIA binary kernel module support files",
            f"Support files used by the NVIDIA kernel modules, version {driver}.\n\n{_STANDIN_NOTE}",
            files={
                STATE_HELPER: File((STANDINS / "nvidia_driver_state.py").read_bytes(), 0o755),
                f"{UNIT_DIR}/{BOOT_UNIT}": _unit(boot_unit),
                f"{UNIT_DIR}/sysinit.target.wants/{BOOT_UNIT}": File(link=f"../{BOOT_UNIT}"),
            },
            scripts=reload,
        ),
        Deb(
            n.dkms,
            version,
            architecture,
            "NVIDIA binary kernel module DKMS source (open kernel module flavor)",
            f"The open NVIDIA kernel modules, version {driver}, built by DKMS for the installed\n"
            f"kernels and loaded at the next boot.\n\n{_STANDIN_NOTE}",
            depends=(f"{n.common} {exact}",),
            conflicts=(n.proprietary,),
            files={f"usr/src/nvidia-{driver}/dkms.conf": File(dkms_conf.encode())},
            scripts=installed("module", n.dkms),
        ),
        Deb(
            n.compute,
            version,
            architecture,
            "NVIDIA driver CUDA integration components",
            f"The compute part of the NVIDIA driver {driver}: libcuda, NVML and nvidia-smi.\n\n{_STANDIN_NOTE}",
            depends=(f"{n.common} {exact}",),
            files={"usr/bin/nvidia-smi": File((STANDINS / "nvidia_smi.py").read_bytes(), 0o755)},
            scripts=installed("userspace", n.compute),
        ),
        Deb(
            "nvidia-open",
            version,
            architecture,
            "NVIDIA driver with open kernel modules (metapackage)",
            f"Installs the NVIDIA driver {driver} with the open kernel modules.\n\n{_STANDIN_NOTE}",
            depends=(f"{n.compute} {exact}", f"{n.dkms} {exact}"),
        ),
        Deb(
            "nvidia-fabricmanager",
            version,
            architecture,
            "Fabric Manager for NVSwitch based systems.",
            f"Fabric Manager {driver} configures the NVSwitches of HGX systems; it runs only with\n"
            f"the NVIDIA driver of the same version.\n\n{_STANDIN_NOTE}",
            depends=(f"{n.common} {exact}",),
            files={
                "usr/bin/nv-fabricmanager": _standin("nv_fabricmanager.sh", driver),
                "usr/bin/nvidia-fabricmanager-start.sh": _standin("nvidia_fabricmanager_start.sh", driver),
                "usr/share/nvidia/nvswitch/fabricmanager.cfg": File(fabricmanager_cfg.encode()),
                f"{UNIT_DIR}/nvidia-fabricmanager.service": _unit(fabricmanager_unit),
            },
            scripts=reload,
        ),
        Deb(
            "nvidia-imex",
            version,
            architecture,
            "NVIDIA Internode Memory Exchange service",
            f"The IMEX daemon {driver} shares GPU memory across the nodes of an NVLink domain;\n"
            f"it runs only with the NVIDIA driver of the same version.\n\n{_STANDIN_NOTE}",
            depends=(f"{n.common} {exact}",),
            files={
                "usr/bin/nvidia-imex": _standin("nvidia_imex.sh", driver),
                "etc/nvidia-imex/config.cfg": File(imex_cfg.encode()),
                "etc/nvidia-imex/nodes_config.cfg": File(nodes_cfg.encode()),
                f"{UNIT_DIR}/nvidia-imex.service": _unit(imex_unit),
            },
            conffiles=("/etc/nvidia-imex/config.cfg", "/etc/nvidia-imex/nodes_config.cfg"),
            scripts=reload,
        ),
    ]


def nvlsm_deb(architecture: str) -> Deb:
    """``nvlsm``, the NVLink subnet manager the fabric manager of an NVLink 5 board starts: versioned
    on its own (not the driver's, not pinned), depending on libibumad3 (Debian's), with the
    configuration file the fabric manager's start script is given."""
    conf = "# NVLink subnet manager configuration (stand-in: read, not interpreted).\nlog_file /var/log/nvlsm.log\n"
    return Deb(
        "nvlsm",
        NVLSM_VERSION,
        architecture,
        "NVIDIA NVLink Subnet Manager",
        f"The subnet manager of the NVLink 5 fabric of HGX B200/B300 boards, started by the\n"
        f"fabric manager.\n\n{_STANDIN_NOTE}",
        depends=("libibumad3",),
        files={NVLSM_CONF: File(conf.encode()), NVLSM_BINARY: _standin("nvlsm.sh", NVLSM_VERSION)},
        conffiles=(f"/{NVLSM_CONF}",),
    )


def pinning_deb(target: str, distro: str = "debian12") -> Deb:
    """``nvidia-driver-pinning-<target>``: a branch (``580``) or one driver version (``580.95.05``),
    pinning the driver packages of tree ``distro`` by their names there."""
    is_branch = "." not in target
    pinned = [*DRIVER_PACKAGES]
    for driver in DRIVER_VERSIONS:
        n = names(distro, driver)
        pinned += [n.compute, n.dkms, n.common]
    what = f"driver branch {target}" if is_branch else f"driver version {target}"
    pattern = f"{target}.*" if is_branch else f"{target}-*"
    name = f"nvidia-driver-pinning-{target}"
    preferences = (
        f"# {name}: APT driver pinning file for {what}.\n"
        f"Package: {' '.join(dict.fromkeys(pinned))}\n"
        f"Pin: version {pattern}\n"
        "Pin-Priority: 1000\n"
    )
    return Deb(
        name,
        f"{target}-{names(distro, DRIVER_VERSIONS[0]).revision}",
        "all",
        f"APT driver pinning file for {what}",
        f"Pins the NVIDIA driver packages to {what}.\n\n{_STANDIN_NOTE}",
        provides=("nvidia-driver-pinning",),
        conflicts=("nvidia-driver-pinning",),
        replaces=("nvidia-driver-pinning",),
        # apt reads only files without an extension or ending in .pref from preferences.d.
        files={f"etc/apt/preferences.d/{name}.pref": File(preferences.encode())},
    )


def keyring_deb(repo: Repository) -> Deb:
    """``cuda-keyring``: the repository's key and its source entry."""
    source = f"deb [signed-by=/{KEYRING_FILE}] {repo.url} /\n"
    pin = "Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n"
    list_file = f"etc/apt/sources.list.d/cuda-{repo.distro}-{repo.arch_dir}.list"
    pin_file = "etc/apt/preferences.d/cuda-repository-pin-600"
    return Deb(
        "cuda-keyring",
        KEYRING_VERSION,
        "all",
        "GPG keyring for the CUDA repository",
        f"The key that signs the CUDA repository, and the repository as an apt source.\n\n{_STANDIN_NOTE}",
        files={
            KEYRING_FILE: File(repo.public_key),
            list_file: File(source.encode()),
            pin_file: File(pin.encode()),
        },
        conffiles=(f"/{list_file}", f"/{pin_file}"),
    )


def catalogue(repo: Repository) -> list[Deb]:
    """Every package of the repository: keyring, pinning packages, and the driver at each version."""
    debs = [keyring_deb(repo)]
    for target in sorted({branch_of(v) for v in DRIVER_VERSIONS}) + list(DRIVER_VERSIONS):
        debs.append(pinning_deb(target, repo.distro))
    for driver in DRIVER_VERSIONS:
        debs += driver_debs(driver, repo.architecture, repo.distro)
    if repo.architecture == "amd64":
        # the NVLink 5 HGX boards that need it are x86_64 machines; nvlsm is not known in sbsa trees
        debs.append(nvlsm_deb(repo.architecture))
    return debs


def _stage(deb: Deb, tree: Path) -> None:
    control = tree / "DEBIAN"
    control.mkdir(parents=True)
    sums = []
    for relative, entry in sorted(deb.files.items()):
        path = tree / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.link is not None:
            path.symlink_to(entry.link)
            continue
        path.write_bytes(entry.data)
        path.chmod(entry.mode)
        if f"/{relative}" not in deb.conffiles:
            sums.append(f"{hashlib.md5(entry.data).hexdigest()}  {relative}\n")  # noqa: S324 - dpkg's format
    (control / "control").write_text(deb.control(), encoding="utf-8")
    (control / "md5sums").write_text("".join(sums), encoding="utf-8")
    if deb.conffiles:
        (control / "conffiles").write_text("".join(f"{c}\n" for c in deb.conffiles), encoding="utf-8")
    for name, text in deb.scripts.items():
        script = control / name
        script.write_text(text, encoding="utf-8")
        script.chmod(0o755)
    for dirpath, dirnames, filenames in os.walk(tree, topdown=False):
        for name in filenames + dirnames:
            os.utime(Path(dirpath) / name, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
        Path(dirpath).chmod(0o755)
        os.utime(dirpath, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH))


def build_deb(deb: Deb, out_dir: Path) -> Path:
    """Build ``deb`` into ``out_dir`` with ``dpkg-deb --build``; return the package file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / deb.filename
    with tempfile.TemporaryDirectory(prefix="kimi-deb-") as tmp:
        tree = Path(tmp) / "tree"
        _stage(deb, tree)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(tree), str(target)], env=env)
    return target


def build_all(out_dir: Path, repo: Repository) -> list[Path]:
    """Build every package of :func:`catalogue` into ``out_dir`` (emptied first)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    return [build_deb(deb, out_dir) for deb in catalogue(repo)]
