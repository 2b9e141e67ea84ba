"""The hosts' operating systems a recipe may name, and the platform each gives a release.

A release's lock is valid for one platform: the host OS's Python (releases are virtual environments
of its ``python3``), its C library (which manylinux wheels run) and the CPU architecture. A recipe
that names its hosts' OS (``os:``, for every topology or per topology) has its release locks made
on the controller before any host is touched (``kimi-deploy lock RECIPE --releases``) and kept
beside it; a host whose probe reports another platform is refused before anything is installed.

The Python and glibc each OS release ships (its ``python3`` and ``libc6`` packages):

- Debian 12 "bookworm": python3 3.11.2, libc6 2.36 (packages.debian.org/bookworm)
- Debian 13 "trixie": python3 3.13.5, libc6 2.41 (packages.debian.org/trixie)
- Ubuntu 22.04 "jammy": python3 3.10.6, libc6 2.35 (packages.ubuntu.com/jammy)
- Ubuntu 24.04 "noble": python3 3.12.3, libc6 2.39 (packages.ubuntu.com/noble)

The CPU architecture follows the accelerator: a GB200 or GB300 tray's host CPU is NVIDIA Grace
(Arm Neoverse V2: aarch64); HGX B300/H200 systems and TPU7x hosts are x86_64, and so is a host
serving on its CPUs unless the topology says otherwise (``machine:``).
"""

from __future__ import annotations

from typing import Literal

from kimi_deploy.releases.lock import HostPlatform

HostOs = Literal["debian-12", "debian-13", "ubuntu-22.04", "ubuntu-24.04"]
OS_RELEASES: dict[HostOs, tuple[tuple[int, int], tuple[int, int]]] = {
    "debian-12": ((3, 11), (2, 36)),
    "debian-13": ((3, 13), (2, 41)),
    "ubuntu-22.04": ((3, 10), (2, 35)),
    "ubuntu-24.04": ((3, 12), (2, 39)),
}


def platform_of(os_name: HostOs, machine: str) -> HostPlatform:
    """The platform the hosts of ``os_name`` on ``machine`` install releases for."""
    python, glibc = OS_RELEASES[os_name]
    return HostPlatform(python, machine, glibc)
