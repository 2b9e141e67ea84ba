"""The host's hardware, read in one round-trip and bounded in time: prints one JSON line.

Stdlib only, Python 3.10+. Input: one argument, base64 of zlib-compressed JSON (every key optional):
  {"weights_dir": str (default "/"), "measure": bool (default false): time a sequential read there,
   "nvml": bool (default true): try NVML (module ``pynvml``) before nvidia-smi,
   "topology": bool (default true): read ``nvidia-smi topo -m`` (the report shows it; a converge
               decides nothing on it and leaves it out: one nvidia-smi less per host and run),
   "root": str (default "/"): prefix of every /sys, /proc, /dev and /etc path read (tests),
   "timeout_s": float (default 3): how long each command (nvidia-smi, dpkg-query, systemctl) may run,
   "metadata_url": str: base URL of the GCE metadata attributes (default: the metadata server)}

Output: raw values for ``kimi_deploy.host.profile.parse_profile``; every section is a dict, and a
section that failed holds an ``"error"`` string (the script itself never raises):
  {"schema": 1, "elapsed_s": float,
   "nvidia": {"nvml": {"driver_version", "cuda_version": int, "devices": [{"index", "name", "uuid",
                       "memory_mib", "pci_bus_id", "compute_cap", "nvlink_active", "fabric", "errors"}]}
                      | {"error": str} | None (not tried),
              "smi_query": CMD | None (NVML answered or no nvidia-smi),
              "smi_topo": CMD | None (no nvidia-smi, or not asked for),
              "smi_fields": [str], "pci_gpus": {"devices": [{"address", "vendor", "device", "class"}]}},
   "tpu": {"pci": [{"address", "vendor", "device"}], "nodes": ["/dev/vfio/0", "/dev/accel0", ...],
           "metadata": {"accelerator-type": str | None, "agent-worker-number": str | None, "error"?}
                       | None (no Google accelerator on PCI)},
   "rdma": {"ports": [{"device", "port", "state", "phys_state", "rate", "link_layer"}]},
   "host": {"meminfo": {"MemTotal": "... kB", "MemAvailable": "... kB"}, "numa_nodes": int,
            "cpu_model": str | None, "cpu_count": int | None, "os_release": {"ID", "VERSION_ID", "PRETTY_NAME"},
            "kernel": str},
   "disk": {"requested", "path", "mount_point", "fs_type", "total_bytes", "free_bytes",
            "read": {"bytes", "seconds", "source": "existing" | "temp", "file"} | {"error"} | None},
   "drivers": {"proc_version": str | None, "dpkg": CMD | None, "services": CMD | None}}
  CMD = {"argv", "rc": int | None, "stdout", "stderr", "error": str | None}  (raw, rc None: not run/timed out)
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import importlib.util
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.shared_queries import NVIDIA_PACKAGES, SERVICE_STATES, on_path

# Names for type checkers only: typing and the answers' types cost every probe ~10 ms to import
# (kimi_deploy/host/command.py leaves this block's hostside modules out of the bundle).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from kimi_deploy.hostside.probe_types import (
        CommandRun,
        DiskRead,
        DiskSection,
        HardwareAnswer,
        HostSection,
        PciDevice,
        PciGpus,
        RdmaPort,
        RdmaSection,
        SectionError,
        TpuSection,
    )
    from kimi_deploy.hostside.unit_show import UnitShow

    _T = TypeVar("_T")

GOOGLE_VENDOR = "0x1ae0"
NVIDIA_VENDOR = "0x10de"
# Google PCI functions that are not accelerators (gVNIC, NVMe disks): their presence alone must not
# send the probe to the metadata server.
GOOGLE_NOT_ACCELERATORS = frozenset({"0x0042", "0x001f"})
METADATA_URL = "http://169.254.169.254/computeMetadata/v1/instance/attributes/"
METADATA_KEYS = ("accelerator-type", "agent-worker-number")
SMI_FIELDS = ("index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version", "compute_cap")
SERVICES = ("nvidia-fabricmanager", "nvidia-imex")
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}

COMMAND_TIMEOUT_S = 3.0
NVML_TIMEOUT_S = 3.0
METADATA_TIMEOUT_S = 1.0
# The fallback nvidia-smi query gets what is left of this, counted from the start (at least 0.5 s).
DEADLINE_S = 4.0
MEASURE_BUDGET_S = 2.0
READ_LIMIT = 256 << 20
TEMP_SIZE = 64 << 20
CHUNK = 4 << 20
# Smallest existing file worth timing; below it the probe times a file of its own.
EXISTING_MIN = 64 << 20
# Files looked at while searching for one to read: a weights directory holds ~100, never a million.
WALK_LIMIT = 5000
OUTPUT_LIMIT = 64 << 10
_NODE = re.compile(r"node\d+")
_ENV = {**os.environ, "LC_ALL": "C", "LANG": "C"}


class Command:
    """A command started now and collected later, so that slow tools run side by side."""

    def __init__(self, argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> None:
        self.argv = argv
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.error: str | None = None
        self.proc: subprocess.Popen[str] | None = None
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                env=_ENV,
                start_new_session=True,
            )
        except OSError as exc:
            self.error = str(exc)

    def result(self) -> CommandRun:
        out: CommandRun = {"argv": self.argv, "rc": None, "stdout": "", "stderr": "", "error": self.error}
        if self.proc is None:
            return out
        try:
            stdout, stderr = self.proc.communicate(timeout=max(0.0, self.deadline - time.monotonic()))
            out["rc"] = self.proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            try:
                stdout, stderr = self.proc.communicate(timeout=0.5)
            except subprocess.TimeoutExpired:
                stdout, stderr = "", ""
            out["error"] = f"timed out after {self.timeout:g} s"
        out["stdout"], out["stderr"] = (stdout or "")[:OUTPUT_LIMIT], (stderr or "")[:OUTPUT_LIMIT]
        return out


class Shown:
    """The fabric manager's and IMEX's ``systemctl show``, cut out of the host probe's one
    (hostside/unit_show.py) when it can say what this command would have printed; else run here,
    as ``Command`` does."""

    def __init__(self, argv: list[str], timeout: float, shown: UnitShow) -> None:
        self.argv, self.timeout, self.shown = argv, timeout, shown

    def result(self) -> CommandRun:
        properties = self.argv[2].removeprefix("--property=").split(",")
        stdout = self.shown.answer(properties, self.argv[3:])
        if stdout is None:
            return Command(self.argv, self.timeout).result()
        return {"argv": self.argv, "rc": 0, "stdout": stdout[:OUTPUT_LIMIT], "stderr": "", "error": None}


def _section(build: Callable[[], _T]) -> _T | SectionError:
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - a probe reports what broke and carries on
        return {"error": f"{type(exc).__name__}: {exc}"}


def _in(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# NVIDIA -----------------------------------------------------------------------------------------


def _nvml_device(nv: Any, index: int) -> dict[str, Any]:
    import ctypes  # noqa: PLC0415 - loaded by pynvml already; a host without NVML never needs it

    handle = nv.nvmlDeviceGetHandleByIndex(index)
    device: dict[str, Any] = {"index": index}
    errors: dict[str, str] = {}

    def get(key: str, read: Callable[[], Any]) -> None:
        try:
            device[key] = read()
        except Exception as exc:  # noqa: BLE001 - one unreadable value must not hide the others
            device[key] = None
            errors[key] = str(exc)

    get("name", lambda: _text(nv.nvmlDeviceGetName(handle)))
    get("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle)))
    get("memory_mib", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20))
    get("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId))
    get("compute_cap", lambda: "{}.{}".format(*nv.nvmlDeviceGetCudaComputeCapability(handle)))
    active, answered = 0, False
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:  # noqa: BLE001, S112 - a link the GPU lacks answers with an NVML error
            continue
        answered = True
        active += int(state == getattr(nv, "NVML_FEATURE_ENABLED", 1))
    device["nvlink_active"] = active if answered else None
    device["fabric"] = None
    if hasattr(nv, "nvmlDeviceGetGpuFabricInfoV") and hasattr(nv, "c_nvmlGpuFabricInfoV_t"):
        info_type, read_fabric = nv.c_nvmlGpuFabricInfoV_t, nv.nvmlDeviceGetGpuFabricInfoV
    elif hasattr(nv, "nvmlDeviceGetGpuFabricInfo") and hasattr(nv, "c_nvmlGpuFabricInfo_t"):
        info_type, read_fabric = nv.c_nvmlGpuFabricInfo_t, nv.nvmlDeviceGetGpuFabricInfo
    else:
        info_type = None
    if info_type is not None:
        try:
            info = info_type()
            read_fabric(handle, ctypes.byref(info))
            if int(info.state) != 0:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: not a fabric GPU
                raw = bytes(bytearray(info.clusterUuid)).hex()
                device["fabric"] = {
                    "cluster_uuid": f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:32]}",
                    "clique_id": int(info.cliqueId),
                    "state": FABRIC_STATES.get(int(info.state), str(int(info.state))),
                    "status": int(info.status),
                }
        except Exception as exc:  # noqa: BLE001 - older drivers lack the call; that is no fabric
            if "Not Supported" not in str(exc) and "Function Not Found" not in str(exc):
                errors["fabric"] = str(exc)
    device["errors"] = errors
    return device


def _nvml() -> dict[str, Any]:
    nv = importlib.import_module("pynvml")
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - e.g. Driver/library version mismatch: say it, fall back
        return {"error": _text(exc) or type(exc).__name__}
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        try:
            cuda: int | None = int(nv.nvmlSystemGetCudaDriverVersion())
        except Exception:  # noqa: BLE001 - the CUDA version is a nicety
            cuda = None
        devices = [_nvml_device(nv, i) for i in range(int(nv.nvmlDeviceGetCount()))]
    finally:
        with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
            nv.nvmlShutdown()
    return {"driver_version": driver, "cuda_version": cuda, "devices": devices}


class NvmlRun(threading.Thread):
    """NVML in a thread: a wedged driver can block nvmlInit for minutes, the probe waits a bounded time."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.result: dict[str, Any] | SectionError | None = None

    def run(self) -> None:
        self.result = _section(_nvml)


def _pci_gpus(root: str) -> PciGpus:
    return {"devices": [d for d in _pci(root, (NVIDIA_VENDOR,)) if d["class"].startswith("0x03")]}


def _pci(root: str, vendors: tuple[str, ...]) -> list[dict[str, Any]]:
    found = []
    for directory in sorted(glob.glob(_in(root, "/sys/bus/pci/devices/*"))):
        vendor = (_read(os.path.join(directory, "vendor")) or "").strip().lower()
        if vendor in vendors:
            found.append(
                {
                    "address": os.path.basename(directory),
                    "vendor": vendor,
                    "device": (_read(os.path.join(directory, "device")) or "").strip().lower(),
                    "class": (_read(os.path.join(directory, "class")) or "").strip().lower(),
                }
            )
    return found


# TPU --------------------------------------------------------------------------------------------


def _metadata(base: str) -> dict[str, Any]:
    # Imported here, not above: they cost a converged host's probe more than all its reads, and
    # only a TPU host asks its metadata server.
    import http.client  # noqa: PLC0415
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    if not base.startswith("http://"):
        return {"error": f"metadata_url {base!r} is not an http:// URL"}
    # No proxy: the metadata server is link-local and a proxy would carry the request off the host.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + METADATA_TIMEOUT_S
    out: dict[str, Any] = dict.fromkeys(METADATA_KEYS)
    for key in METADATA_KEYS:
        left = deadline - time.monotonic()
        if left <= 0:
            out["error"] = f"no answer within {METADATA_TIMEOUT_S:g} s"
            break
        url = base.rstrip("/") + "/" + key
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310 - http:// checked
        try:
            with opener.open(request, timeout=left) as response:
                out[key] = response.read(4096).decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            out.setdefault("error", f"{key}: HTTP {exc.code}")
        except (OSError, ValueError, http.client.HTTPException) as exc:
            out["error"] = f"{key}: {exc}"
            break  # unreachable: the next key would only wait again
    return out


def _tpu(root: str, metadata_url: str) -> TpuSection:
    pci: list[PciDevice] = [
        {"address": d["address"], "vendor": d["vendor"], "device": d["device"]} for d in _pci(root, (GOOGLE_VENDOR,))
    ]
    nodes = sorted(
        os.path.join("/dev/vfio", name)
        for name in (os.listdir(_in(root, "/dev/vfio")) if os.path.isdir(_in(root, "/dev/vfio")) else [])
        if name != "vfio"
    )
    nodes += sorted("/dev/" + os.path.basename(p) for p in glob.glob(_in(root, "/dev/accel*")))
    accelerators = [d for d in pci if d["device"] not in GOOGLE_NOT_ACCELERATORS]
    return {"pci": pci, "nodes": nodes, "metadata": _metadata(metadata_url) if accelerators else None}


# RDMA, host -------------------------------------------------------------------------------------


def _rdma(root: str) -> RdmaSection:
    ports: list[RdmaPort] = []
    for port_dir in sorted(glob.glob(_in(root, "/sys/class/infiniband/*/ports/*"))):
        device = os.path.basename(os.path.dirname(os.path.dirname(port_dir)))

        def read(name: str, folder: str = port_dir) -> str | None:
            value = _read(os.path.join(folder, name))
            return value.strip() if value is not None else None

        ports.append(
            {
                "device": device,
                "port": os.path.basename(port_dir),
                "state": read("state"),
                "phys_state": read("phys_state"),
                "rate": read("rate"),
                "link_layer": read("link_layer"),
            }
        )
    return {"ports": ports}


def _cpu(root: str) -> tuple[str | None, int | None]:
    model: str | None = None
    count = 0
    arm: dict[str, str] = {}
    for line in (_read(_in(root, "/proc/cpuinfo")) or "").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor":
            count += 1
        elif key in ("model name", "Model Name", "cpu model", "cpu") and model is None and value:
            model = value
        elif key in ("CPU implementer", "CPU part") and key not in arm:
            arm[key] = value
    if model is None and arm:
        # arm64 prints no model name, only the implementer and part codes of the core.
        model = f"implementer {arm.get('CPU implementer', '?')} part {arm.get('CPU part', '?')}"
    return model, count or os.cpu_count()


def _os_release(root: str) -> dict[str, str | None]:
    text = _read(_in(root, "/etc/os-release")) or _read(_in(root, "/usr/lib/os-release")) or ""
    values: dict[str, str | None] = dict.fromkeys(("ID", "VERSION_ID", "PRETTY_NAME"))
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() in values:
            try:
                words = shlex.split(value)
            except ValueError:
                words = [value.strip()]
            values[key.strip()] = " ".join(words)
    return values


def _host(root: str) -> HostSection:
    meminfo = {}
    for line in (_read(_in(root, "/proc/meminfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            meminfo[key] = value.strip()
    nodes = [p for p in glob.glob(_in(root, "/sys/devices/system/node/node*")) if _NODE.fullmatch(os.path.basename(p))]
    model, count = _cpu(root)
    kernel = (_read(_in(root, "/proc/sys/kernel/osrelease")) or "").strip() or os.uname().release
    return {
        "meminfo": meminfo,
        "numa_nodes": len(nodes),
        "cpu_model": model,
        "cpu_count": count,
        "os_release": _os_release(root),
        "kernel": kernel,
        # the python3 the releases are installed with (hostside/venv_install.py runs under it too)
        "python": ".".join(str(n) for n in sys.version_info[:3]),
    }


# Disk -------------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash in octal (\040 ...).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount(root: str, path: str) -> tuple[str | None, str | None]:
    best: tuple[str | None, str | None] = (None, None)
    best_len = -1
    for line in (_read(_in(root, "/proc/mounts")) or "").splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point, fs_type = _unescape(fields[1]), fields[2]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # >=: a later mount on the same point hides the earlier one.
        if inside and len(point) >= best_len:
            best, best_len = (point, fs_type), len(point)
    return best


def _largest_file(top: str) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    seen = 0
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            seen += 1
            if seen > WALK_LIMIT:
                return best
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and (best is None or st.st_size > best[1]):
                best = (path, st.st_size)
    return best


def _timed_read(path: str, deadline: float) -> tuple[int, float]:
    fd = os.open(path, os.O_RDONLY)
    try:
        # Drop the file from the page cache so the read comes from the disk.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buffer = bytearray(CHUNK)
        total = 0
        start = time.monotonic()
        with open(fd, "rb", buffering=0, closefd=False) as f:
            while total < READ_LIMIT and time.monotonic() < deadline:
                n = f.readinto(buffer)
                if not n:
                    break
                total += n
        return total, time.monotonic() - start
    finally:
        os.close(fd)


def _measure(path: str, free: int) -> DiskRead | SectionError:
    deadline = time.monotonic() + MEASURE_BUDGET_S
    largest = _largest_file(path) if os.path.isdir(path) else None
    if largest is not None and largest[1] >= EXISTING_MIN:
        total, seconds = _timed_read(largest[0], deadline)
        return {"bytes": total, "seconds": seconds, "source": "existing", "file": largest[0]}
    if free < 4 * TEMP_SIZE:
        return {"error": f"only {free} bytes free in {path}: no room for a {TEMP_SIZE >> 20} MiB test file"}
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    import tempfile  # noqa: PLC0415 - only a measuring probe writes a file

    fd, temp = tempfile.mkstemp(prefix=".kimi-read-probe-", dir=directory)
    try:
        # Random blocks: a compressing filesystem must not shrink what the read then times.
        block = os.urandom(1 << 20)
        written = 0
        write_until = deadline - MEASURE_BUDGET_S / 2
        while written < TEMP_SIZE and time.monotonic() < write_until:
            written += os.write(fd, block)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        fd = -1
        total, seconds = _timed_read(temp, deadline)
        return {"bytes": total, "seconds": seconds, "source": "temp", "file": None}
    finally:
        if fd >= 0:
            os.close(fd)
        os.unlink(temp)


def _disk(root: str, requested: str, measure: bool) -> DiskSection:
    path = os.path.abspath(requested)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    path = os.path.realpath(path)
    point, fs_type = _mount(root, path)
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    return {
        "requested": requested,
        "path": path,
        "mount_point": point,
        "fs_type": fs_type,
        "total_bytes": st.f_blocks * st.f_frsize,
        "free_bytes": free,
        "read": _section(lambda: _measure(path, free)) if measure else None,
    }


# Main -------------------------------------------------------------------------------------------


def probe(request: dict[str, Any], shown: UnitShow | None = None) -> HardwareAnswer:
    """The host's hardware. ``shown``: the host probe's one ``systemctl show``, which answers
    this part's when it can (hostside/unit_show.py)."""
    start = time.monotonic()
    root = str(request.get("root") or "/")
    timeout = float(request.get("timeout_s") or COMMAND_TIMEOUT_S)
    smi = on_path("nvidia-smi")
    topo = Command([smi, "topo", "-m"], timeout) if smi and request.get("topology", True) else None
    query_argv = [smi or "nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    # The drivers part's own queries (hostside/shared_queries.py); the profile keeps the driver's,
    # the fabric manager's and IMEX's packages of it (kimi_deploy.host.profile).
    dpkg = Command(NVIDIA_PACKAGES, timeout) if on_path("dpkg-query") else None
    show = [*SERVICE_STATES, *SERVICES]
    services: Command | Shown | None = None
    if on_path("systemctl"):
        services = Command(show, timeout) if shown is None else Shown(show, timeout, shown)
    nvml: NvmlRun | None = None
    nvml_result: dict[str, Any] | SectionError | None = None
    if request.get("nvml", True):
        try:
            has_pynvml = importlib.util.find_spec("pynvml") is not None
        except (ImportError, ValueError):
            has_pynvml = False
        if has_pynvml:
            nvml = NvmlRun()
            nvml.start()
    # Without NVML the query runs now, beside the others.
    query = Command(query_argv, timeout) if smi and nvml is None else None

    tpu = _section(lambda: _tpu(root, str(request.get("metadata_url") or METADATA_URL)))
    rdma = _section(lambda: _rdma(root))
    host = _section(lambda: _host(root))
    disk = _section(lambda: _disk(root, str(request.get("weights_dir") or "/"), bool(request.get("measure"))))
    # Display-class NVIDIA functions (0x03xxxx): the GPUs even before a driver is installed; not NVSwitches.
    pci_gpus = _section(lambda: _pci_gpus(root))
    proc_version = _read(_in(root, "/proc/driver/nvidia/version"))

    if nvml is not None:
        nvml.join(max(0.0, start + NVML_TIMEOUT_S - time.monotonic()))
        nvml_result = nvml.result or {"error": f"NVML gave no answer within {NVML_TIMEOUT_S:g} s"}
        if smi and "error" in nvml_result:
            query = Command(query_argv, min(timeout, max(0.5, start + DEADLINE_S - time.monotonic())))
    return {
        "schema": 1,
        "nvidia": {
            "nvml": nvml_result,
            "smi_query": query.result() if query else None,
            "smi_topo": topo.result() if topo else None,
            "smi_fields": list(SMI_FIELDS),
            "pci_gpus": pci_gpus,
        },
        "tpu": tpu,
        "rdma": rdma,
        "host": host,
        "disk": disk,
        "drivers": {
            "proc_version": proc_version,
            "dpkg": dpkg.result() if dpkg else None,
            "services": services.result() if services else None,
        },
        "elapsed_s": round(time.monotonic() - start, 4),
    }


def main() -> None:
    try:
        request = read_request()
        result: HardwareAnswer | dict[str, Any] = probe(request if isinstance(request, dict) else {})
    except Exception as exc:  # noqa: BLE001 - whatever happens, the caller gets one JSON line
        result = {"schema": 1, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    if threading.active_count() > 1:
        # A thread still stuck in NVML must not keep the process (and the SSH session) alive.
        os._exit(0)


if __name__ == "__main__":
    main()
