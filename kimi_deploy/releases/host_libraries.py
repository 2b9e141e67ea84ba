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

A release's whole closure (every wheel of its lock, ``tools/needed_libs.py --closure DIR``) needs
more than these from the host, all of it accounted for here: the NVIDIA driver's own libraries
(``DRIVER``), zlib (``BASE``), what the deploy installs with the program that loads it
(``INSTALLED``), and plugins a library loads only for a feature the deploy never turns on, each
skipped by its loader when what it links is missing (``ON_DEMAND``). A library the closure needs
that none of these accounts for fails the check.

Each library maps to the package that ships it on each host OS (packages.debian.org and
packages.ubuntu.com, "Search the contents of packages"): Debian 13 and Ubuntu 24.04 renamed
libcurl4 to libcurl4t64 in the 64-bit time_t transition. A recipe that names no OS gets Debian
12's names, the lab's hosts' OS.
"""

from __future__ import annotations

from kimi_deploy.releases.host_os import OS_RELEASES, HostOs

DEFAULT_OS: HostOs = "debian-12"

PACKAGES: dict[str, dict[HostOs, str]] = {
    "libcurl.so.4": {
        "debian-12": "libcurl4",
        "ubuntu-22.04": "libcurl4",
        "debian-13": "libcurl4t64",
        "ubuntu-24.04": "libcurl4t64",
    },
    "libibverbs.so.1": dict.fromkeys(OS_RELEASES, "libibverbs1"),
    # rdma-core's providers: libmlx5.so.1 (ConnectX), beside libibverbs1, which only recommends them
    "libmlx5.so.1": dict.fromkeys(OS_RELEASES, "ibverbs-providers"),
    "libnuma.so.1": dict.fromkeys(OS_RELEASES, "libnuma1"),
    # OpenSSL 3's two libraries, one package (renamed like libcurl4 in the time_t transition)
    "libssl.so.3": {
        "debian-12": "libssl3",
        "ubuntu-22.04": "libssl3",
        "debian-13": "libssl3t64",
        "ubuntu-24.04": "libssl3t64",
    },
    "libcrypto.so.3": {
        "debian-12": "libssl3",
        "ubuntu-22.04": "libssl3",
        "debian-13": "libssl3t64",
        "ubuntu-24.04": "libssl3t64",
    },
}

MOONCAKE_MASTER = ("libcurl.so.4", "libibverbs.so.1", "libnuma.so.1")
MOONCAKE_CLIENT = ("libcurl.so.4", "libibverbs.so.1", "libmlx5.so.1", "libnuma.so.1")
# NIXL's core (``.nixl_cu13.mesonpy.libs/libnixl.so`` of nixl-cu13 1.5.1, which ``import nixl``
# loads for vLLM's NixlConnector) links its etcd client, and that and the curl it carries link
# OpenSSL 3 from the host.
NIXL_CLIENT = ("libssl.so.3", "libcrypto.so.3")


def packages(libraries: tuple[str, ...], os: HostOs | None) -> tuple[str, ...]:
    """The packages holding ``libraries`` on hosts of ``os`` (None: Debian 12's names)."""
    return tuple(dict.fromkeys(PACKAGES[name][os or DEFAULT_OS] for name in libraries))


# The NVIDIA driver's own libraries (the converge installs the driver: kimi_deploy/accelerators/nvidia_drivers.py).
DRIVER = frozenset({"libcuda.so.1", "libnvidia-ml.so.1"})
# In the base system of every OS above (Priority: required, in debootstrap's minbase), same name.
BASE = {"libz.so.1": "zlib1g"}
# A closure member (a glob on its path in the wheel), and the libraries the deploy installs where
# that member is loaded.
INSTALLED: dict[str, tuple[str, ...]] = {
    # with the Mooncake store client, on the hosts of a topology whose KV cache goes through the
    # store (Topology.mooncake_store; kimi_deploy/converge/plan.py)
    "mooncake*": MOONCAKE_CLIENT,
    # with NIXL, on the engine hosts of a topology with NixlConnector (kimi_deploy/converge/plan.py)
    "*nixl_cu13*": NIXL_CLIENT,
    # vLLM's CPU build's extensions: libnuma1 (kimi_deploy/engines/vllm.py CPU_PACKAGES)
    "vllm/_C*.abi3.so": ("libnuma.so.1",),
}
_NIXL_PLUGINS = (
    "libplugin_GDS",
    "libplugin_GPUNETIO",
    "libplugin_LIBFABRIC",
    "libplugin_INFINIA",
    "libplugin_OBJ",
    "libtelemetry_exporter_",
)
_NIXL_PLUGIN = (
    "NIXL's backend and telemetry plugins other than the UCX one vLLM's NixlConnector uses: "
    "the plugin manager dlopens each and skips one that fails ('Failed to load plugin', "
    "src/core/nixl_plugin_manager.cpp loadPluginFromPath)"
)
# Closure members loaded only for a feature the deploy never turns on, and why a missing library
# of theirs costs nothing: their loader skips them (each cited).
ON_DEMAND: dict[str, str] = {
    "torchcodec/libtorchcodec_*": (
        "torchcodec's FFmpeg bindings, one per FFmpeg major, loaded to decode video or audio; "
        "`import torchcodec` goes on without FFmpeg (torchcodec/_internally_replaced_utils.py, "
        "0.17.0) and vLLM guards the import (vllm/multimodal/video_decoders/torchcodec.py, "
        "vllm/multimodal/media/audio.py, 0.33.0); a text model decodes none"
    ),
    "numba/np/ufunc/tbbpool*": (
        "numba's TBB threading layer: numba/np/ufunc/parallel.py (0.65.0) _launch_threads falls "
        "back to omp, then workqueue, on ImportError"
    ),
    "numba/np/ufunc/omppool*": "numba's OpenMP threading layer: as tbbpool, workqueue is the fallback",
    **{f"*nixl_cu1?*/{plugin}*": _NIXL_PLUGIN for plugin in _NIXL_PLUGINS},
    "*nixl*_cu12*": (
        "NIXL's CUDA 12 build: the nixl package imports the build of torch's CUDA major "
        "(nixl/__init__.py, nixl_meta_utils.py detect_cuda_major, 1.5.1), nixl_cu13 beside CUDA 13"
    ),
    "nixl_cu1?.libs/libaws-*": "the AWS SDK of NIXL's object-store (OBJ) plugin, skipped as above",
    "nixl_cu1?.libs/libazure-*": "the Azure SDK of NIXL's AZURE_BLOB plugin, skipped as above",
    "nixl_cu1?.libs/ucx/libuct_ib_efa*": (
        "UCX's AWS EFA transport: UCX loads its transport modules at init and skips one whose "
        "libraries are missing (ucs/sys/module.c, ucs_module_load_one)"
    ),
    "nixl_cu1?.libs/ucx/libuct_ib_mlx5_gdp*": "UCX's GPU-direct-async mlx5 transport (libflexio), skipped as above",
    "nixl_cu1?.libs/ucx/libucx_perftest_*": "UCX's perftest module (ucx_perftest), never run",
    "nvidia/nvshmem/lib/nvshmem_bootstrap_*": (
        "NVSHMEM's MPI, OpenSHMEM and PMIx bootstraps, loaded only when NVSHMEM_BOOTSTRAP names "
        "one (https://docs.nvidia.com/nvshmem/api/gen/env.html#bootstrap-options)"
    ),
    "nvidia/nvshmem/lib/nvshmem_transport_*": (
        "NVSHMEM's remote transports, loaded only when NVSHMEM_REMOTE_TRANSPORT names one "
        "(https://docs.nvidia.com/nvshmem/api/gen/env.html#transport-options)"
    ),
    "nvidia/*/lib/libcufile_rdma.so.*": (
        "cuFile's RDMA path for GPUDirect Storage over a network file system, loaded only when "
        "cufile.json names RDMA devices (https://docs.nvidia.com/gpudirect-storage/"
        "configuration-guide/index.html); weights are read from local disks"
    ),
    "torch_memory_saver_hook_mode_*_cu12.abi3.so": (
        "torch_memory_saver's CUDA 12 builds: it loads `<stem>_cu<torch's CUDA major>` only "
        "(torch_memory_saver/utils.py get_binary_path_from_package, 0.0.9.post1)"
    ),
    "torch_memory_saver_hook_mode_preload.abi3.so": "an unsuffixed build torch_memory_saver never selects (as above)",
    "torch_memory_saver_hook_mode_torch.abi3.so": "an unsuffixed build torch_memory_saver never selects (as above)",
    "tokenspeed_mooncake.libs/*": (
        "the Mooncake transfer engine TokenSpeed ships (its `mooncake` package), imported inside "
        "functions for prefill/decode transfers and the L3 Mooncake store only "
        "(tokenspeed/runtime/pd/base/mooncake_engine.py, runtime/cache/l3/mooncake.py, 0.1.1), "
        "which no TokenSpeed topology here uses"
    ),
    "intel_openmp-*.data/data/lib/libarcher.so": (
        "Archer, the OpenMP data-race checker, loaded only when OMP_TOOL_LIBRARIES names it"
    ),
    "intel_openmp-*.data/data/lib/libomptarget*": (
        "the OpenMP offload runtime's device plugins (OpenCL, Level Zero, SYCL), loaded only for "
        "`omp target` regions; torch's CPU build uses libiomp5 alone"
    ),
    "intel_cmplr_lib_ur-*.data/data/lib/*": (
        "SYCL's unified-runtime adapters (OpenCL, Level Zero), loaded only when a SYCL device is "
        "opened; torch's CPU build opens none"
    ),
}
