"""Fake accelerators for a test host: written into its root filesystem before it boots.

``install(root, hardware)`` writes ``/etc/kimi-fake-accelerators.json`` (what the host "has") and, for
NVIDIA hardware, ``/usr/bin/nvidia-smi``: the stand-in in ``standins/nvidia_smi.py``, which answers
from that file the way the real tool does (``nvidia-smi``, ``-L``, ``--query-gpu``, ``topo -m``, ...).
Hardware specs: ``b300x8``, ``h200x8``, ``gb300x4``, ``tpu7x4`` (no nvidia-smi, only the description
of four TPU chips behind /dev/vfio) and ``none``.

Values come from real machines: names, memory (MiB), power limits, bus ids, PCI device ids and
``topo -m`` layouts as published ``nvidia-smi`` outputs show them (H200: ../shared/fixtures/nvidia).
GPU UUIDs and serials are fixed per host root, so a host keeps them across restarts. A driver-install
stand-in may rewrite ``driver_version`` in the JSON (default 580.95.05), or set ``driver_loaded:
false`` (no kernel module) or an ``nvml_version`` other than the driver's (a reboot is pending):
the stand-in driver packages of ``nvidia_debs`` do, from inside the host, and set both again at
every boot, so a host made anew from this description still reports the driver it has installed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcluster.host_root import write_changed

CONFIG_PATH = "etc/kimi-fake-accelerators.json"
NVIDIA_SMI_PATH = "usr/bin/nvidia-smi"
# What the host reads as /proc/devices (bound over it by localcluster.hosts): the controller's, plus
# the character device the nvidia module registers for IMEX channels, under the name nvidia-modprobe
# looks for (NVIDIA/nvidia-modprobe modprobe-utils/nvidia-modprobe-utils.h:51,
# NV_CAPS_IMEX_CHANNELS_MODULE_NAME; nvidia_cap_imex_channel_mknod reads its major from /proc/devices).
PROC_DEVICES_PATH = "usr/lib/kimi-standin/proc-devices"
IMEX_CHANNELS = "nvidia-caps-imex-channels"
DEFAULT_DRIVER = "580.95.05"
_SCRIPT = Path(__file__).resolve().parent / "standins" / "nvidia_smi.py"
# How install() recognises a nvidia-smi it wrote (and may remove when the hardware changes).
_MARKER = b"Stand-in ``nvidia-smi``"


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int
    reserved_mib: int
    compute_cap: str
    power_limit_w: int
    idle_power_w: tuple[int, ...]
    pci_device_id: str
    vbios: str
    pcie_gen: int
    clock_max_sm_mhz: int


B300 = GpuModel(
    "NVIDIA B300 SXM6 AC",
    275040,
    536,
    "10.3",
    1100,
    (181, 184, 183, 179, 184, 181, 182, 180),
    "0x318210DE",
    "97.10.4A.00.0B",
    6,
    2032,
)
H200 = GpuModel(
    "NVIDIA H200", 143771, 528, "9.0", 700, (76, 74, 73, 77, 75, 78, 74, 76), "0x233510DE", "96.00.A5.00.01", 5, 1980
)
GB300 = GpuModel(
    "NVIDIA GB300", 284208, 538, "10.3", 1400, (172, 172, 171, 175), "0x31C210DE", "97.10.5B.00.04", 6, 2032
)


@dataclass(frozen=True)
class Layout:
    """One host's GPUs, NICs and how ``topo -m`` relates them."""

    model: GpuModel
    bus_ids: tuple[str, ...]
    gpu_numa: tuple[int, ...]
    cpu_affinity: tuple[str, ...]  # per NUMA node
    numa_affinity: tuple[str, ...]  # per NUMA node
    nic_numa: tuple[int, ...]
    attached: dict[int, tuple[int, str]]  # GPU -> (NIC behind the same switch, relation)
    nic_pairs: frozenset[tuple[int, int]]  # NIC ports of one card: PIX
    near: str  # GPU/NIC or NIC/NIC relation within a NUMA node
    # How the GPUs' NVLinks meet: "nvlink5" (NVSwitches managed through a ConnectX bridge: the fabric
    # manager starts the NVLink subnet manager), "nvswitch" (NVSwitches the fabric manager drives
    # itself), "none" (no NVSwitch on the host: a Grace Blackwell tray, whose switch trays manage it)
    fabric: str
    link: str = "NV18"


LAYOUTS = {
    # HGX B300: one ConnectX-8 per GPU behind the GPU's own PCIe switch.
    "b300x8": Layout(
        B300,
        tuple(f"00000000:{b}:00.0" for b in ("1A", "40", "62", "73", "9A", "BD", "DF", "F0")),
        (0, 0, 0, 0, 1, 1, 1, 1),
        ("0-63,128-191", "64-127,192-255"),
        ("0", "1"),
        (0, 0, 0, 0, 1, 1, 1, 1),
        {i: (i, "PIX") for i in range(8)},
        frozenset(),
        "NODE",
        "nvlink5",
    ),
    # As in ../shared/fixtures/nvidia/h200x8_topo_m.txt: 12 NICs, two of them dual-port cards.
    "h200x8": Layout(
        H200,
        tuple(f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")),
        (0, 0, 0, 0, 1, 1, 1, 1),
        ("0-55,112-167", "56-111,168-223"),
        ("0", "1"),
        (0,) * 6 + (1,) * 6,
        {gpu: (nic, "PXB") for gpu, nic in enumerate((0, 3, 4, 5, 6, 9, 10, 11))},
        frozenset({(1, 2), (7, 8)}),
        "NODE",
        "nvswitch",
    ),
    # A Grace Blackwell Ultra compute tray (two Grace CPUs, four GPUs): every NIC hangs off a CPU.
    "gb300x4": Layout(
        GB300,
        ("00000008:06:00.0", "00000009:06:00.0", "00000018:06:00.0", "00000019:06:00.0"),
        (0, 0, 1, 1),
        ("0-71", "72-143"),
        ("0,2-17", "1,18-33"),
        (0, 0, 0, 0, 1, 1, 1, 1),
        {},
        frozenset({(2, 3), (6, 7)}),
        "SYS",
        "none",
    ),
}
TPU_CHIPS = {"tpu7x4": 4}
HARDWARE = (*LAYOUTS, *TPU_CHIPS, "none")


def _digest(seed: str, what: str) -> str:
    return hashlib.sha256(f"{seed}/{what}".encode()).hexdigest()


def _relation(layout: Layout, gpu: int, nic: int) -> str:
    if layout.attached.get(gpu, (-1, ""))[0] == nic:
        return layout.attached[gpu][1]
    return layout.near if layout.gpu_numa[gpu] == layout.nic_numa[nic] else "SYS"


def _nic_relation(layout: Layout, a: int, b: int) -> str:
    if (min(a, b), max(a, b)) in layout.nic_pairs:
        return "PIX"
    return layout.near if layout.nic_numa[a] == layout.nic_numa[b] else "SYS"


def describe(hardware: str, seed: str) -> dict[str, Any]:
    """The accelerator description of ``hardware``; ``seed`` makes UUIDs and serials host-specific."""
    if hardware == "none":
        return {"schema": 1, "hardware": "none", "vendor": None}
    if hardware in TPU_CHIPS:
        chips = [
            {
                "index": i,
                "device": f"/dev/vfio/{i}",
                "iommu_group": i,
                "pci_address": f"0000:00:{4 + i:02x}.0",
                "vendor_id": "0x1ae0",
                "tensor_cores": 2,
                "hbm_gib": 192,
            }
            for i in range(TPU_CHIPS[hardware])
        ]
        return {"schema": 1, "hardware": hardware, "vendor": "google", "accelerator_type": "tpu7x", "chips": chips}
    if hardware not in LAYOUTS:
        raise ValueError(f"unknown hardware {hardware!r} (known: {', '.join(HARDWARE)})")
    layout = LAYOUTS[hardware]
    m = layout.model
    gpus = []
    for i, bus in enumerate(layout.bus_ids):
        h = _digest(seed, f"{hardware}/gpu{i}")
        numa = layout.gpu_numa[i]
        gpus.append(
            {
                "index": i,
                "name": m.name,
                "uuid": f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}",
                "serial": str(int(h[32:48], 16))[:13].rjust(13, "1"),
                "pci_bus_id": bus,
                "pci_device_id": m.pci_device_id,
                "vbios_version": m.vbios,
                "memory_total_mib": m.memory_mib,
                "memory_reserved_mib": m.reserved_mib,
                "compute_cap": m.compute_cap,
                "power_limit_w": m.power_limit_w,
                "power_idle_w": m.idle_power_w[i % len(m.idle_power_w)] + int(h[48:50], 16) / 256,
                "temperature_c": 26 + int(h[50:52], 16) % 15,
                "pcie_gen_max": m.pcie_gen,
                "pcie_width_max": 16,
                "clock_max_sm_mhz": m.clock_max_sm_mhz,
                "clock_idle_sm_mhz": 345,
                "cpu_affinity": layout.cpu_affinity[numa],
                "numa_affinity": layout.numa_affinity[numa],
                "gpu_numa_id": "N/A",
            }
        )
    nics = range(len(layout.nic_numa))
    return {
        "schema": 1,
        "hardware": hardware,
        "vendor": "nvidia",
        "driver_version": DEFAULT_DRIVER,
        "fabric": layout.fabric,
        "gpus": gpus,
        "topology": {
            "link": layout.link,
            "nics": [f"mlx5_{k}" for k in nics],
            "gpu_nic": [[_relation(layout, i, k) for k in nics] for i in range(len(gpus))],
            "nic_nic": [[_nic_relation(layout, a, b) for b in nics] for a in nics],
        },
    }


def install(root: Path, hardware: str) -> None:
    """Give the host whose root filesystem is ``root`` the accelerators of ``hardware`` (see HARDWARE)."""
    description = describe(hardware, str(root.resolve()))
    config = root / CONFIG_PATH
    smi = root / NVIDIA_SMI_PATH
    write_changed(config, (json.dumps(description, indent=1) + "\n").encode(), 0o644)
    devices = root / PROC_DEVICES_PATH
    if description["vendor"] == "nvidia":
        write_changed(smi, _SCRIPT.read_bytes(), 0o755)
        write_changed(devices, proc_devices(Path("/proc/devices").read_text(encoding="utf-8")).encode(), 0o444)
    else:
        devices.unlink(missing_ok=True)
        if smi.is_file() and _MARKER in smi.read_bytes():
            smi.unlink()


def proc_devices(real: str) -> str:
    """``real`` (a /proc/devices) with the IMEX channels' character device registered as the kernel
    registers a dynamic one: the highest free major from 254 down (Linux fs/char_dev.c, find_dynamic_major)."""
    head, sep, block = real.partition("\nBlock devices:")
    used = {int(line.split()[0]) for line in head.splitlines()[1:] if line.split() and line.split()[0].isdigit()}
    major = next(m for m in range(254, 233, -1) if m not in used)
    lines = [*head.rstrip("\n").splitlines(), f"{major:3d} {IMEX_CHANNELS}"]
    body = [lines[0], *sorted(lines[1:], key=lambda line: int(line.split()[0]))]
    return "\n".join(body) + "\n" + sep + block
