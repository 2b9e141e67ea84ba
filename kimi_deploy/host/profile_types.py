"""The host profile as a typed record: what ``kimi_deploy.host.profile.parse_profile`` makes of a
hardware probe's answer, and what the preflight gates, the accelerator kinds and the report read.

Every key of a record is always present (``None`` where the host did not say); the values are
the types below because ``parse_profile`` and the kinds' readers checked them on the way in (a
host's answer is outside the recipe: a value of another type reads as unknown). The records are
plain dicts at run time, so a profile is JSON as it stands (the report, ``facts check --json``).
"""

from __future__ import annotations

from typing import TypedDict

from kimi_deploy.hostside.probe_types import DriversAnswer, StateAnswer


class TopoGpu(TypedDict, total=False):
    """A GPU of ``nvidia-smi topo -m``: its name and index, and the affinity columns printed."""

    name: str
    index: int
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: str | None


class TopoNic(TypedDict):
    name: str
    device: str | None


class Topology(TypedDict):
    """``nvidia-smi topo -m`` (``kimi_deploy.parsers.nvidia_smi_topo``)."""

    gpus: list[TopoGpu]
    nics: list[TopoNic]
    matrix: dict[str, dict[str, str]]
    legend: dict[str, str]
    nic_legend: dict[str, str]


class Fabric(TypedDict, total=False):
    """A Grace Blackwell GPU's fabric (NVML): its clique and state."""

    index: int | None
    cluster_uuid: str | None
    clique_id: int | None
    state: str | None
    status: int | None  # NVML's return code of the fabric's probe (0: success)


class Device(TypedDict, total=False):
    """One accelerator device, with the keys its source reads: a GPU (NVML or nvidia-smi), a TPU
    chip's PCI function, or a device on PCI with no driver answering (address and id only)."""

    index: int | None
    name: str | None
    uuid: str | None
    memory_mib: int | None
    pci_bus_id: str | None
    compute_cap: str | None
    nvlink_active: int | None
    fabric: Fabric | None
    pci_address: str | None
    vendor_id: str | None
    device_id: str | None
    generation: str | None
    iommu_group: int | None


class TpuInfo(TypedDict):
    generation: str | None
    chip_count: int
    accelerator_type: str | None
    worker: int | None


class Accelerators(TypedDict):
    """The host's accelerators of one kind (the first kind whose devices the probe found)."""

    vendor: str
    count: int
    model: str | None
    memory_mib: int | None
    devices: list[Device]
    driver_version: str | None
    cuda_version: str | None
    source: str | None
    error: str | None
    topology: Topology | None
    nvlink_active: int | None
    fabric: list[Fabric] | None
    tpu: TpuInfo | None


def no_accelerators(vendor: str) -> Accelerators:
    """``vendor``'s accelerators with nothing found: every key unknown. A kind's reader starts from
    it and sets what it found; a host with none of any kind reads as it with the kind ``none``."""
    return {
        "vendor": vendor,
        "count": 0,
        "model": None,
        "memory_mib": None,
        "devices": [],
        "driver_version": None,
        "cuda_version": None,
        "source": None,
        "error": None,
        "topology": None,
        "nvlink_active": None,
        "fabric": None,
        "tpu": None,
    }


class RdmaPort(TypedDict):
    device: str | None
    port: int | str | None
    state: str | None
    phys_state: str | None
    rate_gbps: int | float | None
    link_layer: str | None


class Memory(TypedDict):
    total_bytes: int | None
    available_bytes: int | None


class Cpu(TypedDict):
    model: str | None
    count: int | None


class OsRelease(TypedDict):
    id: str | None
    version_id: str | None
    pretty: str | None
    kernel: str | None
    python: str | None


class Disk(TypedDict):
    path: str | None
    fs_type: str | None
    total_bytes: int | None
    free_bytes: int | None
    read_mb_s: float | None


class Drivers(TypedDict):
    nvidia: str | None
    packages: dict[str, str]
    fabricmanager_active: str | None
    imex_active: str | None


class HostProfile(TypedDict):
    accelerators: Accelerators
    rdma: list[RdmaPort]
    memory: Memory
    numa_nodes: int
    cpu: Cpu
    os: OsRelease
    disk: Disk
    drivers: Drivers
    errors: dict[str, str]


class HostState(StateAnswer):
    """``KimiHostState``: the state probe's answer with the hardware and drivers probes' of the
    same round-trip (``kimi_deploy.host.profile.parse_profile``, ``kimi_pyinfra.facts.drivers``),
    None when the request did not ask for them."""

    hardware: HostProfile | None
    drivers: DriversAnswer | None
