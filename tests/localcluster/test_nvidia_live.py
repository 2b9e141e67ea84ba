"""End to end on a one-host cluster of its own: the pinned NVIDIA driver from the cluster's apt repository.

A host installs ``cuda-keyring``, a version pin and the compute-only driver with the fabric manager
the way the NVIDIA Driver Installation Guide says (which on this B300 board starts only with the
NVLink subnet manager and ``ib_umad``, loaded again at boot), is refused a fabric manager of another version,
upgrades within the branch (nvidia-smi then reports the NVML mismatch and a reboot is required),
reboots with ``systemctl reboot`` and comes back with the new driver loaded. Then every process of
the cluster is killed with SIGKILL and ``down`` still removes all of it.

The cluster has its own state directory and subnet (``KIMI_NVIDIA_TEST_SUBNET``, default
10.213.10.0/24), so it runs beside the default cluster; the test is skipped when that subnet's
bridge already exists.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import apt_repo, process_argv
from localcluster.state import Settings
from tests.localcluster.conftest import TIMINGS, Cluster, checked, cluster_cli, why_not_here

pytestmark = pytest.mark.localcluster

SUBNET = os.environ.get("KIMI_NVIDIA_TEST_SUBNET", "10.213.10.0/24")
HOST = "kimi-h1"
DRIVER, NEWER = "580.95.05", "580.105.08"
# The guide's compute-only install on Debian, plus what an HGX or NVL72 system needs besides.
PACKAGES = "nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-fabricmanager nvidia-imex"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y"
SMI_VERSION = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", "dev", name], capture_output=True, check=False).returncode == 0


@pytest.fixture(scope="module")
def apt_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = why_not_here()
    if reason is not None:
        pytest.skip(reason)
    env = {
        **os.environ,
        "KIMI_CLUSTER_DIR": str(tmp_path_factory.mktemp("nvidia-cluster")),
        "KIMI_CLUSTER_SUBNET": SUBNET,
    }
    settings = Settings.from_env(env)
    if _link_exists(settings.bridge):
        pytest.skip(f"{SUBNET} is in use (bridge {settings.bridge} exists): set KIMI_NVIDIA_TEST_SUBNET")
    started = time.monotonic()
    checked(cluster_cli("up", "--hosts", "1", "--hardware", "b300x8", env=env))
    TIMINGS["up, 1 host in the NVIDIA driver cluster"] = time.monotonic() - started
    try:
        yield Cluster(settings, env)
    finally:
        started = time.monotonic()
        checked(cluster_cli("down", env=env))
        TIMINGS["down, NVIDIA driver cluster"] = time.monotonic() - started


def sh(cluster: Cluster, command: str) -> str:
    return cluster.ssh(HOST, command).stdout


def boot_id(cluster: Cluster) -> str:
    return sh(cluster, "cat /proc/sys/kernel/random/boot_id").strip()


def wait_for_new_boot(cluster: Cluster, old: str, timeout: float = 60) -> str:
    """Wait until the host answers from a boot other than ``old`` and has finished booting."""
    deadline = time.monotonic() + timeout
    probe = "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait"
    last = ""
    while time.monotonic() < deadline:
        try:
            # A connection made while the old system goes down may hang: keep each try short.
            proc = subprocess.run(
                cluster.ssh_argv(HOST, probe), capture_output=True, text=True, timeout=10, check=False
            )
        except subprocess.TimeoutExpired:
            continue
        lines = proc.stdout.split()
        if lines and lines[0] != old and lines[-1] in ("running", "degraded"):
            return lines[-1]
        last = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        time.sleep(0.2)
    raise AssertionError(f"{HOST}: no new boot within {timeout:.0f} s: {last}")


def test_pinned_driver_install_refusal_upgrade_and_reboot(apt_cluster: Cluster) -> None:
    c = apt_cluster
    started = time.monotonic()
    arch_dir = apt_repo.REPO_ARCHES[apt_repo.deb_architecture()]
    repo = f"{c.state['services']['apt']['url']}/debian12/{arch_dir}"
    keyring = shlex.quote(f"{repo}/cuda-keyring_1.1-1_all.deb")
    sh(c, f"curl -fsSLo /tmp/cuda-keyring.deb {keyring} && dpkg -i /tmp/cuda-keyring.deb && apt-get -q update")
    sh(c, f"{APT} install nvidia-driver-pinning-{DRIVER}")
    sh(c, f"{APT} install {PACKAGES}")
    assert sh(c, SMI_VERSION).split() == [DRIVER] * 8
    assert sh(c, "test -e /var/run/reboot-required && echo pending || echo none").strip() == "none"
    # A B300 board is NVLink 5: its fabric manager starts only with the NVLink subnet manager beside it.
    bare = c.ssh(HOST, "systemctl enable --now nvidia-fabricmanager.service", check=False)
    assert bare.returncode != 0
    said = sh(c, "journalctl -u nvidia-fabricmanager.service -o cat --no-pager | grep 'cannot start'")
    assert said.strip() == (
        "NVLink subnet manager cannot start: missing nvlsm (no /opt/nvidia/nvlsm/sbin/nvlsm), "
        "nvlsm's configuration /usr/share/nvidia/nvlsm/nvlsm.conf, ibstat (infiniband-diags), the ib_umad kernel module"
    )
    sh(c, f"{APT} install nvlsm infiniband-diags")
    # The hosts are containers: the cluster's stand-in modprobe records the module (fake_kernel.py),
    # and loads what modules-load.d lists at every boot.
    sh(c, "modprobe ib_umad && echo ib_umad > /etc/modules-load.d/ib_umad.conf")
    sh(c, "systemctl restart nvidia-fabricmanager.service")
    assert sh(c, "systemctl is-active nvidia-fabricmanager.service").strip() == "active"
    unknown = c.ssh(HOST, "modprobe no_such_module", check=False)
    assert (unknown.returncode, unknown.stderr.strip()) == (
        1,
        f"modprobe: FATAL: Module no_such_module not found in directory /lib/modules/{sh(c, 'uname -r').strip()}",
    )

    # Converged: installing the same again changes nothing.
    again = sh(c, f"{APT} install {PACKAGES}")
    assert "0 upgraded, 0 newly installed, 0 to remove and 0 not upgraded." in again

    # The fabric manager must match the driver: apt refuses another version and changes nothing.
    refused = c.ssh(HOST, f"{APT} install nvidia-fabricmanager={NEWER}-1", check=False)
    assert refused.returncode == 100
    assert (
        f"nvidia-fabricmanager : Depends: nvidia-kernel-common (= {NEWER}-1) but {DRIVER}-1 is to be installed"
        in refused.stdout
    ), refused.stdout + refused.stderr
    assert sh(c, "dpkg-query -W -f '${Version}' nvidia-fabricmanager") == f"{DRIVER}-1"

    # Upgrade within the branch: new userspace now, new kernel module at the next boot.
    sh(c, f"{APT} install nvidia-driver-pinning-{NEWER}")
    upgrade = sh(c, f"{APT} install {PACKAGES}")
    assert "5 upgraded, 0 newly installed, 0 to remove" in upgrade, upgrade
    mismatch = c.ssh(HOST, "nvidia-smi", check=False)
    assert (mismatch.returncode, mismatch.stdout) == (
        18,
        f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {NEWER}\n",
    )
    assert sh(c, "cat /var/run/reboot-required.pkgs").split() == ["nvidia-driver-cuda", "nvidia-kernel-open-dkms"]
    TIMINGS["NVIDIA driver: install, refusal, upgrade"] = time.monotonic() - started

    # Reboot like a real machine: the host comes back on its own, with the new driver loaded.
    loop_pid = c.host(HOST)["pid"]
    before = boot_id(c)
    started = time.monotonic()
    c.ssh(HOST, "systemctl reboot", check=False)
    assert wait_for_new_boot(c, before) == "running"
    TIMINGS["NVIDIA driver: reboot until running again"] = time.monotonic() - started
    assert sh(c, SMI_VERSION).split() == [NEWER] * 8
    assert sh(c, "test -e /var/run/reboot-required && echo pending || echo none").strip() == "none"
    assert sh(c, "systemctl is-active nvidia-fabricmanager.service").strip() == "active"
    assert c.host(HOST)["pid"] == loop_pid
    checked(cluster_cli("status", env=c.env))


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_down_removes_everything_after_every_process_is_killed(apt_cluster: Cluster) -> None:
    c = apt_cluster
    state = c.state
    loops = [h["pid"] for h in state["hosts"]]
    pids = loops + [child for pid in loops for child in _children(pid)]
    pids += [s["pid"] for s in state["services"].values()]
    assert len(pids) == len(loops) * 2 + len(state["services"])
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(process_argv(pid) for pid in pids):
        assert time.monotonic() < deadline, "killed processes still there"
        time.sleep(0.05)
    assert cluster_cli("status", env=c.env).returncode == 1

    checked(cluster_cli("down", env=c.env))
    settings = c.settings
    assert not _link_exists(settings.bridge)
    assert not Path("/run/netns", settings.netns(HOST)).exists()
    assert str(settings.state_dir) not in Path("/proc/self/mountinfo").read_text()
    # `down` removes a host's cgroups only once no process is left in them.
    assert list(Path("/sys/fs/cgroup").glob(f"*/kimi-cluster/{settings.bridge}")) == []
    left = [
        p.name
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and str(settings.state_dir) in " ".join(process_argv(int(p.name)) or [])
    ]
    assert left == []
