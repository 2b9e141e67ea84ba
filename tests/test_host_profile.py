"""The hardware probe run here against fake host trees, and the HostProfile made from its answers.

The probe runs exactly as over SSH (``facts.host_state.hostside_command`` under ``/bin/sh``), with
``root`` pointing at a tree under tmp_path, only a fake ``bin`` on PATH (the local cluster's
stand-in nvidia-smi, fake dpkg-query and systemctl) and, where NVML is wanted, a fake ``pynvml``.
The metadata server is always a loopback address: no test sends anything off this machine.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import hostside_command
from kimi_deploy.host.profile import matches_model, parse_profile
from kimi_deploy.hostside.requests import HardwareRequest
from kimi_pyinfra.facts.hardware import HostHardware
from localcluster.fake_nvidia import describe
from tests.parsers import fixture

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
STANDIN_SMI = ROOT / "lab" / "localcluster" / "standins" / "nvidia_smi.py"
NVRM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U22-I3-AE18-23-3)  Wed Sep 24 23:03:22 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
DPKG = (
    "nvidia-driver-580-open\t580.95.05-0ubuntu1\tii \n"
    "nvidia-fabricmanager-580\t580.95.05-1\tii \n"
    "nvidia-imex-580\t\tun \n"
    # asked for the drivers step (the same query), left out of the profile
    "cuda-keyring\t1.1-1\tii \n"
    "nvidia-kernel-open-dkms\t580.95.05-1\tii \n"
)
SHOW = (
    "Id=nvidia-fabricmanager.service\nActiveState=active\nUnitFileState=enabled\n\n"
    "Id=nvidia-imex.service\nActiveState=inactive\nUnitFileState=disabled\n"
)
OS_RELEASE = 'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\nID=ubuntu\nID_LIKE=debian\n'
TPU_ADDRESSES = ("0000:00:04.0", "0000:00:05.0", "0000:00:06.0", "0000:00:07.0")

# A stand-in for nvidia-ml-py's ``pynvml``: the calls the probe makes, for a GB300 compute tray.
FAKE_PYNVML = """
import ctypes, os

NVML_NVLINK_MAX_LINKS = 18
NVML_FEATURE_ENABLED = 1


class NVMLError(Exception):
    pass


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint), ("healthMask", ctypes.c_uint32)]


class _Memory:
    total = 284208 << 20


class _Pci:
    def __init__(self, index):
        self.busId = ("00000008:06:00.0", "00000009:06:00.0", "00000018:06:00.0", "00000019:06:00.0")[index].encode()


def nvmlInit():
    if os.environ.get("FAKE_NVML") == "mismatch":
        raise NVMLError("Driver/library version mismatch")

def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return "580.95.05"
def nvmlSystemGetCudaDriverVersion(): return 13000
def nvmlDeviceGetCount(): return 4
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetName(handle): return b"NVIDIA GB300"
def nvmlDeviceGetUUID(handle): return "GPU-0000000%d-1111-2222-3333-444444444444" % handle
def nvmlDeviceGetMemoryInfo(handle): return _Memory()
def nvmlDeviceGetPciInfo(handle): return _Pci(handle)
def nvmlDeviceGetCudaComputeCapability(handle): return (10, 3)


def nvmlDeviceGetNvLinkState(handle, link):
    # GPU 3 has two links down.
    return 0 if handle == 3 and link >= 16 else 1


def nvmlDeviceGetGpuFabricInfoV(handle, ref):
    info = ref._obj
    info.clusterUuid[:] = list(range(16))
    info.cliqueId = 32766
    info.state = 3
    info.status = 0
"""


def write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)


def pci_device(root: Path, address: str, vendor: str, device: str, cls: str) -> None:
    for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
        write(root / "sys/bus/pci/devices" / address / name, value + "\n")


def make_root(tmp_path: Path, *, tpu: bool = False, nvidia_driver: bool = False) -> Path:
    """A host tree: 2 NUMA nodes, 4 CPUs, Ubuntu, 2 RDMA ports (one ACTIVE, one DOWN), an xfs mount
    for the weights; with ``tpu`` four TPU7x chips (and a gVNIC) on PCI behind /dev/vfio."""
    root = tmp_path / "root"
    models = (tmp_path / "models").resolve()
    models.mkdir()
    write(
        root / "proc/meminfo",
        "MemTotal:       2113249712 kB\nMemFree:         2000000000 kB\nMemAvailable:   2051234560 kB\n",
    )
    cpus = "".join(
        f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: INTEL(R) XEON(R) PLATINUM 8570\n\n"
        for i in range(4)
    )
    write(root / "proc/cpuinfo", cpus)
    write(root / "proc/sys/kernel/osrelease", "6.8.0-60-generic\n")
    write(root / "etc/os-release", OS_RELEASE)
    (root / "sys/devices/system/node/node0").mkdir(parents=True)
    (root / "sys/devices/system/node/node1").mkdir()
    write(root / "sys/devices/system/node/possible", "0-1\n")
    # A mount whose name extends the weights mount's must not be taken for it.
    write(
        root / "proc/mounts",
        f"overlay / overlay rw 0 0\n/dev/nvme0n1 {models} xfs rw,noatime 0 0\n/dev/nvme1n1 {models}-old ext4 rw 0 0\n",
    )
    ports = root / "sys/class/infiniband"
    for name, value in (
        ("state", "4: ACTIVE"),
        ("phys_state", "5: LinkUp"),
        ("rate", "400 Gb/sec (4X NDR)"),
        ("link_layer", "InfiniBand"),
    ):
        write(ports / "mlx5_0/ports/1" / name, value + "\n")
    for name, value in (
        ("state", "1: DOWN"),
        ("phys_state", "3: Disabled"),
        ("rate", "2.5 Gb/sec (1X SDR)"),
        ("link_layer", "Ethernet"),
    ):
        write(ports / "mlx5_1/ports/1" / name, value + "\n")
    pci_device(root, "0000:00:01.0", "0x1af4", "0x1041", "0x020000")
    if tpu:
        pci_device(root, "0000:00:03.0", "0x1ae0", "0x0042", "0x020000")  # gVNIC: Google, not a TPU
        for i, address in enumerate(TPU_ADDRESSES):
            pci_device(root, address, "0x1ae0", "0x0076", "0x120000")
            write(root / f"dev/vfio/{i}", "")
        write(root / "dev/vfio/vfio", "")
    if nvidia_driver:
        write(root / "proc/driver/nvidia/version", NVRM)
    return root


def make_bin(tmp_path: Path, *, smi: bool = True, tools: bool = True, hang: bool = False) -> Path:
    """The probe's PATH: the stand-in nvidia-smi (run by this Python), fake dpkg-query and systemctl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if hang:
        write(bin_dir / "nvidia-smi", f"#!{sys.executable}\nimport time\ntime.sleep(30)\n", 0o755)
    elif smi:
        body = STANDIN_SMI.read_text(encoding="utf-8").split("\n", 1)[1]
        write(bin_dir / "nvidia-smi", f"#!{sys.executable}\n{body}", 0o755)
    if tools:
        write(bin_dir / "dpkg-query", f"#!/bin/sh\nprintf '{DPKG}'\nexit 1\n", 0o755)
        # ``systemctl show --property=Id,ActiveState,UnitFileState``: a block per unit, as systemd 252 prints it
        write(bin_dir / "systemctl", f"#!/bin/sh\nprintf '{SHOW}'\n", 0o755)
    return bin_dir


def accelerators_file(tmp_path: Path, hardware: str, **changes: Any) -> Path:
    path = tmp_path / "fake-accelerators.json"
    path.write_text(json.dumps({**describe(hardware, "test-host"), **changes}), encoding="utf-8")
    return path


def run_probe(
    request: HardwareRequest | dict[str, Any], bin_dir: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The probe's one JSON line, run the way the fact runs it over SSH."""
    command = hostside_command(sys.executable, "hardware_probe.py", request)
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        env={"PATH": str(bin_dir), **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    raw: dict[str, Any] = json.loads(lines[0])
    return raw


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that listens but never answers: a probe that connects would show up here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.setblocking(False)
    yield sock
    sock.close()


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# The probe on fake hosts ------------------------------------------------------------------------


def test_b300_host_through_nvidia_smi(tmp_path: Path, listener: socket.socket) -> None:
    root = make_root(tmp_path, nvidia_driver=True)
    config = accelerators_file(tmp_path, "b300x8")
    weights = tmp_path / "models" / "moonshotai--Kimi-K3.1-Pro" / "0123abcd"
    port = listener.getsockname()[1]
    request = {
        "root": str(root),
        "weights_dir": str(weights),
        "measure": True,
        "nvml": False,
        "metadata_url": f"http://127.0.0.1:{port}/computeMetadata/v1/instance/attributes/",
    }
    raw = run_probe(request, make_bin(tmp_path), {"KIMI_FAKE_ACCELERATORS": str(config)})

    # No Google accelerator on PCI: the metadata server was never asked.
    assert raw["tpu"]["metadata"] is None
    with pytest.raises(BlockingIOError):
        listener.accept()
    assert raw["nvidia"]["nvml"] is None
    assert raw["elapsed_s"] < 5

    profile = parse_profile(raw)
    acc = profile["accelerators"]
    gpus = json.loads(config.read_text(encoding="utf-8"))["gpus"]
    assert (acc["vendor"], acc["count"], acc["model"], acc["memory_mib"]) == (
        "nvidia",
        8,
        "NVIDIA B300 SXM6 AC",
        275040,
    )
    assert (acc["source"], acc["error"], acc["driver_version"], acc["cuda_version"]) == (
        "nvidia-smi",
        None,
        "580.95.05",
        None,
    )
    assert acc["devices"][0] == {
        "index": 0,
        "name": "NVIDIA B300 SXM6 AC",
        "uuid": gpus[0]["uuid"],
        "memory_mib": 275040,
        "pci_bus_id": "00000000:1A:00.0",
        "compute_cap": "10.3",
        "nvlink_active": None,
        "fabric": None,
    }
    assert [d["uuid"] for d in acc["devices"]] == [g["uuid"] for g in gpus]
    assert matches_model(acc["model"], "B300")
    assert not matches_model(acc["model"], "GB300")
    topology = acc["topology"]
    assert topology is not None
    assert [g["name"] for g in topology["gpus"]] == [f"GPU{i}" for i in range(8)]
    assert topology["matrix"]["GPU0"]["GPU7"] == "NV18"
    assert topology["matrix"]["GPU3"]["NIC3"] == "PIX"
    assert topology["nic_legend"]["NIC0"] == "mlx5_0"
    assert topology["gpus"][4]["numa_affinity"] == "1"
    assert (acc["nvlink_active"], acc["fabric"], acc["tpu"]) == (None, None, None)

    assert profile["rdma"] == [
        {
            "device": "mlx5_0",
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "rate_gbps": 400,
            "link_layer": "InfiniBand",
        },
        {
            "device": "mlx5_1",
            "port": 1,
            "state": "DOWN",
            "phys_state": "Disabled",
            "rate_gbps": 2.5,
            "link_layer": "Ethernet",
        },
    ]
    assert profile["memory"] == {"total_bytes": 2113249712 * 1024, "available_bytes": 2051234560 * 1024}
    assert profile["numa_nodes"] == 2
    assert profile["cpu"] == {"model": "INTEL(R) XEON(R) PLATINUM 8570", "count": 4}
    assert profile["os"] == {
        "id": "ubuntu",
        "version_id": "24.04",
        "pretty": "Ubuntu 24.04.2 LTS",
        "kernel": "6.8.0-60-generic",
        # the Python the probe ran under, here this one
        "python": ".".join(str(n) for n in sys.version_info[:3]),
    }
    disk = profile["disk"]
    # The weights directory does not exist yet: its nearest existing parent, on the xfs mount.
    assert (disk["path"], disk["fs_type"]) == (str((tmp_path / "models").resolve()), "xfs")
    assert (disk["total_bytes"] or 0) > 0
    assert (disk["free_bytes"] or 0) > 0
    assert (disk["read_mb_s"] or 0) > 0
    assert raw["disk"]["read"]["source"] == "temp"
    assert raw["disk"]["read"]["bytes"] > 0
    assert list((tmp_path / "models").iterdir()) == []  # the test file is gone
    assert profile["drivers"] == {
        "nvidia": "580.95.05",
        "packages": {"nvidia-driver-580-open": "580.95.05-0ubuntu1", "nvidia-fabricmanager-580": "580.95.05-1"},
        "fabricmanager_active": "active",
        "imex_active": "inactive",
    }
    assert profile["errors"] == {}


def test_one_probe_asks_dpkg_and_systemd_once_for_the_hardware_and_drivers_parts(tmp_path: Path) -> None:
    """The converge's probe (hostside/host_probe.py) reads the hardware and the drivers in one
    process; the drivers part takes the hardware part's dpkg-query and systemctl answers, which
    were its own commands, instead of running them again."""
    root = make_root(tmp_path, nvidia_driver=True)
    config = accelerators_file(tmp_path, "b300x8")
    bin_dir = make_bin(tmp_path)
    calls = tmp_path / "calls"
    for tool in ("dpkg-query", "systemctl"):
        script = bin_dir / tool
        head, body = script.read_text(encoding="utf-8").split("\n", 1)
        write(script, f"{head}\necho {tool} >> {calls}\n{body}", 0o755)
    request = {"root": str(root), "weights_dir": str(tmp_path), "nvml": False, "topology": False}
    drivers = {"nvidia": True, "services": ["nvidia-fabricmanager", "nvidia-imex"]}
    command = hostside_command(sys.executable, "host_probe.py", {"hardware": request, "drivers": drivers})
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        env={"PATH": str(bin_dir), "KIMI_FAKE_ACCELERATORS": str(config)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    asked = calls.read_text(encoding="utf-8").splitlines()
    assert sorted(asked) == ["dpkg-query", "systemctl"]
    answer = json.loads(lines["drivers"])
    assert answer["packages"] == {
        "nvidia-driver-580-open": {"version": "580.95.05-0ubuntu1", "held": False},
        "nvidia-fabricmanager-580": {"version": "580.95.05-1", "held": False},
        "cuda-keyring": {"version": "1.1-1", "held": False},
        "nvidia-kernel-open-dkms": {"version": "580.95.05-1", "held": False},
    }
    assert answer["services"] == {
        "nvidia-fabricmanager": {"active": "active", "enabled": "enabled"},
        "nvidia-imex": {"active": "inactive", "enabled": "disabled"},
    }
    assert parse_profile(json.loads(lines["hardware"]))["drivers"]["packages"] == {
        "nvidia-driver-580-open": "580.95.05-0ubuntu1",
        "nvidia-fabricmanager-580": "580.95.05-1",
    }

    # Services the hardware part did not ask about: one systemctl for both parts
    # (hostside/unit_show.py); this one prints the same two blocks whatever it is asked, which
    # cannot be cut into what each part's own would print, so each part then asks systemd itself.
    calls.unlink()
    other = hostside_command(sys.executable, "host_probe.py", {"hardware": request, "drivers": {"services": ["x"]}})
    subprocess.run(
        ["/bin/sh", "-c", other],
        env={"PATH": str(bin_dir), "KIMI_FAKE_ACCELERATORS": str(config)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert sorted(calls.read_text(encoding="utf-8").splitlines()) == [
        "dpkg-query",
        "systemctl",
        "systemctl",
        "systemctl",
    ]


def test_tpu7x_host_metadata_unreachable_fails_fast(tmp_path: Path) -> None:
    root = make_root(tmp_path, tpu=True)
    request = {
        "root": str(root),
        "weights_dir": str(tmp_path / "models"),
        "metadata_url": f"http://127.0.0.1:{unused_port()}/computeMetadata/v1/instance/attributes/",
    }
    started = time.monotonic()
    raw = run_probe(request, make_bin(tmp_path, smi=False, tools=False))
    assert time.monotonic() - started < 5
    assert raw["tpu"]["pci"][0] == {"address": "0000:00:03.0", "vendor": "0x1ae0", "device": "0x0042"}
    assert raw["tpu"]["nodes"] == ["/dev/vfio/0", "/dev/vfio/1", "/dev/vfio/2", "/dev/vfio/3"]
    assert "accelerator-type" in raw["tpu"]["metadata"]["error"]
    assert raw["nvidia"]["smi_topo"] is None
    assert raw["nvidia"]["smi_query"] is None

    profile = parse_profile(raw)
    acc = profile["accelerators"]
    assert (acc["vendor"], acc["count"], acc["model"], acc["source"], acc["error"]) == (
        "tpu",
        4,
        "TPU7x",
        "sysfs",
        None,
    )
    assert acc["tpu"] == {"generation": "7x", "chip_count": 4, "accelerator_type": None, "worker": None}
    assert [d["pci_address"] for d in acc["devices"] if d["generation"]] == list(TPU_ADDRESSES)
    assert matches_model(acc["model"], "TPU7x")
    assert not matches_model(acc["model"], "TPU v6e")
    assert profile["drivers"] == {"nvidia": None, "packages": {}, "fabricmanager_active": None, "imex_active": None}


METADATA = {"accelerator-type": "tpu7x-128", "agent-worker-number": "3"}


class _Metadata(BaseHTTPRequestHandler):
    """The GCE metadata server's answers for a TPU VM, only to requests with its header."""

    def do_GET(self) -> None:
        key = self.path.rsplit("/", 1)[-1]
        if self.headers.get("Metadata-Flavor") != "Google" or key not in METADATA:
            self.send_error(403 if key in METADATA else 404)
            return
        body = METADATA[key].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_tpu7x_host_reads_its_slice_and_worker_from_the_metadata_server(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Metadata)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        request = {
            "root": str(make_root(tmp_path, tpu=True)),
            "metadata_url": f"http://127.0.0.1:{port}/computeMetadata/v1/instance/attributes/",
        }
        raw = run_probe(request, make_bin(tmp_path, smi=False, tools=False))
    finally:
        server.shutdown()
        server.server_close()
    assert raw["tpu"]["metadata"] == METADATA
    tpu = parse_profile(raw)["accelerators"]["tpu"]
    assert tpu == {"generation": "7x", "chip_count": 4, "accelerator_type": "tpu7x-128", "worker": 3}


def test_gb300_tray_through_nvml_with_fabric_and_nvlinks(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    write(lib / "pynvml.py", FAKE_PYNVML)
    config = accelerators_file(tmp_path, "gb300x4")
    env = {"PYTHONPATH": str(lib), "KIMI_FAKE_ACCELERATORS": str(config)}
    raw = run_probe({"root": str(make_root(tmp_path, nvidia_driver=True))}, make_bin(tmp_path), env)
    # NVML answered: nvidia-smi is asked only for the topology.
    assert raw["nvidia"]["smi_query"] is None
    assert raw["nvidia"]["smi_topo"]["rc"] == 0

    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["model"], acc["memory_mib"], acc["source"]) == (
        "nvidia",
        4,
        "NVIDIA GB300",
        284208,
        "nvml",
    )
    assert (acc["driver_version"], acc["cuda_version"], acc["error"]) == ("580.95.05", "13.0", None)
    assert acc["devices"][3] == {
        "index": 3,
        "name": "NVIDIA GB300",
        "uuid": "GPU-00000003-1111-2222-3333-444444444444",
        "memory_mib": 284208,
        "pci_bus_id": "00000019:06:00.0",
        "compute_cap": "10.3",
        "nvlink_active": 16,
        "fabric": {
            "cluster_uuid": "00010203-0405-0607-0809-0a0b0c0d0e0f",
            "clique_id": 32766,
            "state": "completed",
            "status": 0,
        },
    }
    assert acc["nvlink_active"] == 16
    assert acc["fabric"] is not None
    assert [f["index"] for f in acc["fabric"]] == [0, 1, 2, 3]
    assert {f["clique_id"] for f in acc["fabric"]} == {32766}
    assert matches_model(acc["model"], "GB300")
    assert not matches_model(acc["model"], "B300")
    assert acc["topology"] is not None
    assert [g["name"] for g in acc["topology"]["gpus"]] == ["GPU0", "GPU1", "GPU2", "GPU3"]


def test_driver_library_mismatch_is_reported_not_raised(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    write(lib / "pynvml.py", FAKE_PYNVML)
    # A driver upgraded without a reboot: NVML and nvidia-smi both refuse.
    config = accelerators_file(tmp_path, "b300x8", nvml_version="580.105.08")
    env = {"PYTHONPATH": str(lib), "FAKE_NVML": "mismatch", "KIMI_FAKE_ACCELERATORS": str(config)}
    raw = run_probe({"root": str(make_root(tmp_path, nvidia_driver=True))}, make_bin(tmp_path), env)
    assert raw["nvidia"]["nvml"] == {"error": "Driver/library version mismatch"}
    assert raw["nvidia"]["smi_query"]["rc"] == 18

    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["source"]) == ("nvidia", 0, None)
    assert acc["error"] == "Failed to initialize NVML: Driver/library version mismatch"
    assert acc["topology"] is None


def test_a_hanging_nvidia_smi_is_killed_at_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    raw = run_probe({"root": str(make_root(tmp_path)), "nvml": False, "timeout_s": 0.5}, make_bin(tmp_path, hang=True))
    assert time.monotonic() - started < 3
    assert raw["nvidia"]["smi_topo"]["error"] == "timed out after 0.5 s"
    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["error"]) == ("nvidia", 0, "nvidia-smi: timed out after 0.5 s")


def test_an_empty_host_tree_still_answers(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    raw = run_probe(
        {"root": str(empty), "weights_dir": "/nonexistent/models", "nvml": False},
        make_bin(tmp_path, smi=False, tools=False),
    )
    profile = parse_profile(raw)
    assert profile["accelerators"]["vendor"] == "none"
    assert profile["accelerators"]["count"] == 0
    assert profile["rdma"] == []
    assert profile["memory"] == {"total_bytes": None, "available_bytes": None}
    assert profile["numa_nodes"] == 1
    assert profile["os"]["id"] is None
    assert profile["disk"]["path"] == "/"
    assert profile["disk"]["fs_type"] is None
    assert profile["errors"] == {}


def test_fact_command_and_process(tmp_path: Path) -> None:
    fact = HostHardware()
    request: HardwareRequest = {"root": str(make_root(tmp_path)), "nvml": False}
    assert fact.command(request) == hostside_command("python3", "hardware_probe.py", request)
    raw = run_probe(request, make_bin(tmp_path, smi=False))
    profile = fact.process(["some login banner", json.dumps(raw)])
    assert profile["numa_nodes"] == 2
    assert profile["os"]["id"] == "ubuntu"


# parse_profile on probe answers -----------------------------------------------------------------


def smi_run(stdout: str, rc: int = 0, error: str | None = None) -> dict[str, Any]:
    return {"argv": ["nvidia-smi"], "rc": rc, "stdout": stdout, "stderr": "", "error": error}


def nvidia_raw(**nvidia: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "nvml": None,
        "smi_query": None,
        "smi_topo": None,
        "smi_fields": None,
        "pci_gpus": {"devices": []},
    }
    return {"schema": 1, "nvidia": {**section, **nvidia}, "drivers": {}}


@pytest.mark.parametrize(
    ("capture", "rc", "message"),
    [
        (
            "query_error_nvml_mismatch_intel_llvm17614.txt",
            18,
            "Failed to initialize NVML: Driver/library version mismatch",
        ),
        (
            "query_error_driver_unreachable_gcp33.txt",
            9,
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
        ),
        ("query_error_no_devices_genv.txt", 6, "No devices were found"),
    ],
)
def test_nvidia_smi_failure_text_is_the_error_and_no_accelerators(capture: str, rc: int, message: str) -> None:
    raw = nvidia_raw(smi_query=smi_run(fixture(capture), rc), smi_topo=smi_run(fixture(capture), rc))
    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["source"], acc["error"]) == ("nvidia", 0, None, message)
    assert (acc["devices"], acc["model"], acc["memory_mib"], acc["topology"]) == ([], None, None, None)


def test_nvml_answer_with_a_real_gb200_topology() -> None:
    devices = [
        {
            "index": i,
            "name": "NVIDIA GB200",
            "uuid": f"GPU-{i}",
            "memory_mib": 189471 - i,
            "pci_bus_id": f"0000000{i}:01:00.0",
            "compute_cap": "10.0",
            "nvlink_active": 18,
            "errors": {},
            "fabric": {
                "cluster_uuid": "c0ffee00-0000-0000-0000-000000000001",
                "clique_id": 1,
                "state": "completed",
                "status": 0,
            },
        }
        for i in range(4)
    ]
    nvml = {"driver_version": "580.126.09", "cuda_version": 13010, "devices": devices}
    raw = nvidia_raw(nvml=nvml, smi_topo=smi_run(fixture("topo_gb200x4_8nic_spaces_rhel4nv.txt")))
    acc = parse_profile(raw)["accelerators"]
    assert (acc["source"], acc["count"], acc["model"], acc["memory_mib"]) == ("nvml", 4, "NVIDIA GB200", 189468)
    assert (acc["driver_version"], acc["cuda_version"], acc["nvlink_active"]) == ("580.126.09", "13.1", 18)
    assert "errors" not in acc["devices"][0]
    assert acc["fabric"] is not None
    assert acc["fabric"][0] == {
        "index": 0,
        "cluster_uuid": "c0ffee00-0000-0000-0000-000000000001",
        "clique_id": 1,
        "state": "completed",
        "status": 0,
    }
    assert acc["topology"] is not None
    assert len(acc["topology"]["gpus"]) == 4
    assert len(acc["topology"]["nics"]) == 8


def test_nvml_failing_without_nvidia_smi_is_the_error_on_a_driver_host() -> None:
    raw = nvidia_raw(nvml={"error": "Driver Not Loaded"})
    raw["drivers"] = {"proc_version": NVRM}
    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["error"]) == ("nvidia", 0, "NVML: Driver Not Loaded")
    # Without any NVIDIA driver, a pynvml that finds no library says nothing about the host.
    assert (
        parse_profile(nvidia_raw(nvml={"error": "NVML Shared Library Not Found"}))["accelerators"]["vendor"] == "none"
    )


def test_gpus_on_pci_before_any_driver() -> None:
    pci = [
        {"address": f"0000:{b}:00.0", "vendor": "0x10de", "device": "0x3182", "class": "0x030200"} for b in ("1a", "40")
    ]
    acc = parse_profile(nvidia_raw(pci_gpus={"devices": pci}))["accelerators"]
    assert (acc["vendor"], acc["count"], acc["source"], acc["model"], acc["error"]) == (
        "nvidia",
        2,
        "sysfs",
        None,
        None,
    )
    assert acc["devices"][0] == {"pci_address": "0000:1a:00.0", "device_id": "0x3182"}


def test_mixed_gpu_models_have_no_single_model() -> None:
    rows = "0, NVIDIA H200, GPU-a, 143771, 00000000:18:00.0, 570.86.15, 9.0\n1, NVIDIA H100 80GB HBM3, GPU-b, 81559, 00000000:2A:00.0, 570.86.15, 9.0\n"
    acc = parse_profile(nvidia_raw(smi_query=smi_run(rows)))["accelerators"]
    assert (acc["count"], acc["model"], acc["memory_mib"], acc["driver_version"]) == (2, None, 81559, "570.86.15")
    assert [d["name"] for d in acc["devices"]] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert "driver_version" not in acc["devices"][1]


def test_tpu_from_sysfs_ids_and_metadata() -> None:
    pci = [{"address": a, "vendor": "0x1ae0", "device": "0x006f"} for a in TPU_ADDRESSES]
    raw = {"tpu": {"pci": pci, "nodes": [], "metadata": {"accelerator-type": "v6e-16", "agent-worker-number": "2"}}}
    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["model"], acc["source"]) == ("tpu", 4, "TPU v6e", "sysfs")
    assert acc["tpu"] == {"generation": "v6e", "chip_count": 4, "accelerator_type": "v6e-16", "worker": 2}
    assert acc["devices"][0] == {
        "pci_address": "0000:00:04.0",
        "vendor_id": "0x1ae0",
        "device_id": "0x006f",
        "generation": "v6e",
        "iommu_group": None,
    }
    assert matches_model(acc["model"], "v6e")
    assert matches_model(acc["model"], "TPUv6e")


def test_a_google_nic_alone_is_no_tpu() -> None:
    raw = {
        "tpu": {
            "pci": [{"address": "0000:00:03.0", "vendor": "0x1ae0", "device": "0x0042"}],
            "nodes": [],
            "metadata": None,
        }
    }
    acc = parse_profile(raw)["accelerators"]
    assert (acc["vendor"], acc["count"], acc["tpu"]) == ("none", 0, None)


def test_section_errors_and_a_failed_probe_are_kept() -> None:
    raw = {
        "schema": 1,
        "disk": {"error": "PermissionError: [Errno 13] Permission denied: '/srv/models'"},
        "host": {"meminfo": {"MemTotal": "1024 kB"}},
    }
    profile = parse_profile(raw)
    assert profile["errors"] == {"disk": "PermissionError: [Errno 13] Permission denied: '/srv/models'"}
    assert profile["memory"] == {"total_bytes": 1024 * 1024, "available_bytes": None}
    assert parse_profile({"schema": 1, "error": "ValueError: bad request"})["errors"] == {
        "probe": "ValueError: bad request"
    }
    measured = parse_profile({"disk": {"path": "/srv", "read": {"error": "OSError: [Errno 30] Read-only file system"}}})
    assert measured["disk"]["read_mb_s"] is None
    assert measured["errors"] == {"disk.read": "OSError: [Errno 30] Read-only file system"}
    timed = parse_profile(
        {"disk": {"path": "/srv", "read": {"bytes": 268435456, "seconds": 0.5, "source": "existing"}}}
    )
    assert timed["disk"]["read_mb_s"] == 536.9


def test_services_without_systemd_are_unknown() -> None:
    services = {"argv": [], "rc": 1, "stdout": "", "stderr": "System has not been booted with systemd", "error": None}
    drivers = parse_profile({"drivers": {"services": services}})["drivers"]
    assert (drivers["fabricmanager_active"], drivers["imex_active"]) == (None, None)


@pytest.mark.parametrize(
    ("model", "wanted", "expected"),
    [
        ("NVIDIA B300 SXM6 AC", "B300", True),
        ("NVIDIA B300 SXM6 AC", "b300", True),
        ("NVIDIA B300 SXM6 AC", "NVIDIA B300", True),
        ("NVIDIA B300 SXM6 AC", "GB300", False),
        ("NVIDIA B300 SXM6 AC", "B30", False),
        ("NVIDIA GB300", "GB300", True),
        ("NVIDIA GB300", "B300", False),
        ("NVIDIA H200", "H200", True),
        ("NVIDIA H200 NVL", "H200", True),
        ("NVIDIA H200", "H200 NVL", False),
        ("NVIDIA H100 80GB HBM3", "H200", False),
        ("7x", "TPU7x", True),
        ("TPU7x", "TPU7x", True),
        ("TPU 7x", "tpu7x", True),
        ("TPU v7x", "TPU7x", True),
        ("TPU v6e", "TPU7x", False),
        ("TPU v5e", "TPU v5p", False),
        ("NVIDIA B300 SXM6 AC", "TPU7x", False),
        (None, "B300", False),
        ("NVIDIA B300 SXM6 AC", "", False),
    ],
)
def test_matches_model(model: str | None, wanted: str, expected: bool) -> None:
    assert matches_model(model, wanted) is expected
