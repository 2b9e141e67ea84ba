"""Shared libraries the releases' native programs link from the host, and the packages holding them.

A wheel carries most of what its native code links (auditwheel's ``<dist>.libs/``) and relies on
the manylinux baseline for glibc and the C++ runtime; anything else it names must be on the host.
What the deploy runs was read from the published wheels with ``tools/needed_libs.py WHEEL MEMBER``:

- the Mooncake master (``mooncake/mooncake_master`` of mooncake-transfer-engine 0.3.13.post1,
  manylinux_2_28_x86_64): libcurl.so.4, libibverbs.so.1, libnuma.so.1;
- the Mooncake store client vLLM's MooncakeStoreConnector imports (``mooncake/store.so`` of
  mooncake-transfer-engine-cuda13 0.3.13.post1): libcurl.so.4, libibverbs.so.1, libmlx5.so.1,
  libnuma.so.1, and libcuda.so.1 (the NVIDIA driver's) and libcudart.so.13 (the CUDA runtime wheel
  in torch's closure, loaded by torch first), which are not the archive's to provide.

Each library maps to the package that ships it on each host OS (packages.debian.org and
packages.ubuntu.com, "Search the contents of packages"): Debian 13 and Ubuntu 24.04 renamed
libcurl4 to libcurl4t64 in the 64-bit time_t transition. A recipe that names no OS gets Debian
12's names, the lab's hosts' OS.
"""

from __future__ import annotations

from kimi_deploy.host_os import OS_RELEASES, HostOs

DEFAULT_OS: HostOs = "debian-12"

PACKAGES: dict[str, dict[HostOs, str]] = {
    "libcurl.so.4": {"debian-12": "libcurl4", "ubuntu-22.04": "libcurl4", "debian-13": "libcurl4t64",
                     "ubuntu-24.04": "libcurl4t64"},
    "libibverbs.so.1": dict.fromkeys(OS_RELEASES, "libibverbs1"),
    # rdma-core's providers: libmlx5.so.1 (ConnectX), beside libibverbs1, which only recommends them
    "libmlx5.so.1": dict.fromkeys(OS_RELEASES, "ibverbs-providers"),
    "libnuma.so.1": dict.fromkeys(OS_RELEASES, "libnuma1"),
}  # fmt: skip

MOONCAKE_MASTER = ("libcurl.so.4", "libibverbs.so.1", "libnuma.so.1")
MOONCAKE_CLIENT = ("libcurl.so.4", "libibverbs.so.1", "libmlx5.so.1", "libnuma.so.1")


def packages(libraries: tuple[str, ...], os: HostOs | None) -> tuple[str, ...]:
    """The packages holding ``libraries`` on hosts of ``os`` (None: Debian 12's names)."""
    return tuple(dict.fromkeys(PACKAGES[name][os or DEFAULT_OS] for name in libraries))
