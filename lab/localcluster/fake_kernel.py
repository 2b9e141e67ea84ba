"""Kernel modules for a test host, as far as a container can have them: written into its root
filesystem before it boots.

The hosts are systemd-nspawn containers, which cannot load kernel modules. What a deploy does about
modules (``modprobe NAME`` now, a line in ``/etc/modules-load.d`` for every boot) still has to work
on them for the modules of the hardware they stand in for (``ib_umad``, which the NVLink subnet
manager of a B300 board needs). So each host gets:

- ``/usr/local/sbin/modprobe`` (``standins/modprobe.sh``): records such a module as loaded in
  ``/run/kimi-standin-modules/<name>``, and says any other is not found, as kmod's modprobe does;
- ``kimi-standin-modules-load.service``, run at every boot before ``sysinit.target`` like
  systemd-modules-load.service (which a container skips): loads what ``modules-load.d`` lists,
  through that modprobe (``standins/modules_load.sh``).

The stand-in daemons (``standins/nvidia_fabricmanager_start.sh``) read that record; deploys only
run ``modprobe`` and write ``modules-load.d``, as on a real host.
"""

from __future__ import annotations

from pathlib import Path

from localcluster.host_root import early_boot_unit, write_changed

STANDINS = Path(__file__).resolve().parent / "standins"
MODPROBE = "usr/local/sbin/modprobe"
MODULES_LOAD = "usr/local/sbin/kimi-standin-modules-load"
UNIT_NAME = "kimi-standin-modules-load.service"
UNIT = early_boot_unit(
    "Load the kernel modules of modules-load.d (stand-in of systemd-modules-load, kimi-cluster)", f"/{MODULES_LOAD}"
)


def install(root: Path) -> None:
    """Give the host whose root filesystem is ``root`` the stand-in modprobe and modules-load."""
    write_changed(root / MODPROBE, (STANDINS / "modprobe.sh").read_bytes(), 0o755)
    write_changed(root / MODULES_LOAD, (STANDINS / "modules_load.sh").read_bytes(), 0o755)
    write_changed(root / "etc/systemd/system" / UNIT_NAME, UNIT.encode(), 0o644)
    wants = root / "etc/systemd/system/sysinit.target.wants" / UNIT_NAME
    if not wants.is_symlink():
        wants.parent.mkdir(parents=True, exist_ok=True)
        wants.symlink_to(f"../{UNIT_NAME}")
