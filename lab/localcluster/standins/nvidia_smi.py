#!/usr/bin/python3 -IS
"""Stand-in ``nvidia-smi`` for the local test cluster, installed as /usr/bin/nvidia-smi by fake_nvidia.py.

It reads the host's accelerators from /etc/kimi-fake-accelerators.json (``KIMI_FAKE_ACCELERATORS``
overrides the path) and answers like the real tool, output and exit status alike: the default table,
``-L``, ``--version``, ``-q``, ``--query-gpu=... --format=csv[,noheader][,nounits]`` (with ``-i``),
``--query-compute-apps`` (no processes) and ``topo -m``. The file's ``driver_version`` is what it
reports, ``driver_loaded: false`` makes it fail as with no kernel module (exit 9), and an
``nvml_version`` other than the driver's as after a driver upgrade without a reboot (exit 18).
Stdlib only: it runs with the host's python3, isolated and without site (``-IS``: one word,
as the kernel passes a shebang's options as one); typing is imported for type checkers only.
Every probe of a host runs it once, and these imports were half its cost.
"""

from __future__ import annotations

import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Gpu = dict[str, Any]

CONFIG = "/etc/kimi-fake-accelerators.json"
DEFAULT_DRIVER = "580.95.05"
# CUDA version each driver branch reports in the table header.
_CUDA_BY_BRANCH = {
    "535": "12.2",
    "550": "12.4",
    "560": "12.6",
    "565": "12.7",
    "570": "12.8",
    "575": "12.9",
    "580": "13.0",
    "590": "13.1",
}
# nvidia-smi's exit statuses are NVML's error codes.
EXIT_INVALID_ARGUMENT = 2
EXIT_NOT_FOUND = 6
EXIT_DRIVER_NOT_LOADED = 9
EXIT_LIB_RM_VERSION_MISMATCH = 18
# NVML_ERROR_GPU_IS_LOST; nvidia-smi(1), RETURN VALUE: "Return code 15 - The GPU has fallen off the
# bus or has otherwise become inaccessible" (quoted in NVIDIA/cloud-native-docs,
# gpu-operator/troubleshooting.rst).
EXIT_GPU_IS_LOST = 15

_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def _mib(n: int) -> str:
    return f"{n} MiB"


def _watts(n: float) -> str:
    return f"{n:.2f} W"


# --query-gpu fields: name -> (header unit, value of one GPU). Aliases share the canonical header.
def _fields(state: dict[str, Any]) -> dict[str, tuple[str, Callable[[Gpu], str]]]:
    driver = state["driver_version"]
    count = str(len(state["gpus"]))
    return {
        "timestamp": ("", lambda g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
        "driver_version": ("", lambda g: driver),
        "count": ("", lambda g: count),
        "index": ("", lambda g: str(g["index"])),
        "name": ("", lambda g: g["name"]),
        "serial": ("", lambda g: g["serial"]),
        "uuid": ("", lambda g: g["uuid"]),
        "pci.bus_id": ("", lambda g: g["pci_bus_id"]),
        "pci.domain": ("", lambda g: "0x" + g["pci_bus_id"].split(":")[0][-4:]),
        "pci.bus": ("", lambda g: "0x" + g["pci_bus_id"].split(":")[1]),
        "pci.device_id": ("", lambda g: g["pci_device_id"]),
        "vbios_version": ("", lambda g: g["vbios_version"]),
        "persistence_mode": ("", lambda g: "Enabled"),
        "display_mode": ("", lambda g: "Disabled"),
        "compute_mode": ("", lambda g: "Default"),
        "compute_cap": ("", lambda g: g["compute_cap"]),
        "pstate": ("", lambda g: "P0"),
        "fan.speed": (" [%]", lambda g: "[N/A]"),
        "temperature.gpu": ("", lambda g: str(g["temperature_c"])),
        "utilization.gpu": (" [%]", lambda g: "0 %"),
        "utilization.memory": (" [%]", lambda g: "0 %"),
        "memory.total": (" [MiB]", lambda g: _mib(g["memory_total_mib"])),
        "memory.reserved": (" [MiB]", lambda g: _mib(g["memory_reserved_mib"])),
        "memory.used": (" [MiB]", lambda g: _mib(0)),
        "memory.free": (" [MiB]", lambda g: _mib(g["memory_total_mib"] - g["memory_reserved_mib"])),
        "power.draw": (" [W]", lambda g: _watts(g["power_idle_w"])),
        "power.limit": (" [W]", lambda g: _watts(g["power_limit_w"])),
        "power.default_limit": (" [W]", lambda g: _watts(g["power_limit_w"])),
        "power.max_limit": (" [W]", lambda g: _watts(g["power_limit_w"])),
        "clocks.max.sm": (" [MHz]", lambda g: f"{g['clock_max_sm_mhz']} MHz"),
        "clocks.sm": (" [MHz]", lambda g: f"{g['clock_idle_sm_mhz']} MHz"),
        "pcie.link.gen.max": ("", lambda g: str(g["pcie_gen_max"])),
        "pcie.link.gen.current": ("", lambda g: str(g["pcie_gen_max"])),
        "pcie.link.width.max": ("", lambda g: str(g["pcie_width_max"])),
        "pcie.link.width.current": ("", lambda g: str(g["pcie_width_max"])),
        "ecc.mode.current": ("", lambda g: "Enabled"),
        "mig.mode.current": ("", lambda g: "Disabled"),
        # Counters a fault knob of the cluster sets (``ecc_uncorrected_volatile``, ...). Hopper and
        # Blackwell GPUs remap rows instead of retiring pages: retired_pages.* read [N/A] there,
        # remapped_rows.pending No (utkuozdemir/nvidia_gpu_exporter internal/captures, H100 80GB
        # HBM3 on 590.48.01: no unit in these fields' headers).
        "ecc.errors.uncorrected.volatile.total": ("", lambda g: str(g.get("ecc_uncorrected_volatile", 0))),
        "retired_pages.pending": ("", lambda g: str(g.get("retired_pages_pending", "[N/A]"))),
        "remapped_rows.pending": ("", lambda g: str(g.get("remapped_rows_pending", "No"))),
        # Every GPU the cluster fakes belongs to an NVLink fabric (HGX NVSwitch, Grace Blackwell),
        # joined once the fabric manager or the switch trays registered it: "Completed", "Success"
        # (an H200 on 590.48.01, the capture above); a fault knob refuses it as Azure's GB-family
        # image check saw ("Insufficient Resources": Azure/azhpc-images#506, nvidia-smi -q).
        "fabric.state": ("", lambda g: str(g.get("fabric_state", "Completed"))),
        "fabric.status": ("", lambda g: str(g.get("fabric_status", "Success"))),
    }


# Older spellings the real tool still accepts, reported under the canonical name.
_ALIASES = {"gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
_APP_FIELDS = {
    "timestamp": "",
    "gpu_name": "",
    "gpu_bus_id": "",
    "gpu_serial": "",
    "gpu_uuid": "",
    "pid": "",
    "process_name": "",
    "name": "",
    "used_gpu_memory": " [MiB]",
    "used_memory": " [MiB]",
}


class Fail(Exception):
    """nvidia-smi's failure: what it prints on stdout, and its exit status."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


def load() -> dict[str, Any]:
    path = os.environ.get("KIMI_FAKE_ACCELERATORS", CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            state: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        state = {}
    gpus = state.get("gpus") or []
    if state.get("vendor") != "nvidia" or not state.get("driver_loaded", True) or not gpus:
        raise Fail(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n",
            EXIT_DRIVER_NOT_LOADED,
        )
    driver = str(state.get("driver_version") or DEFAULT_DRIVER)
    nvml = str(state.get("nvml_version") or driver)
    if nvml != driver:
        raise Fail(
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {nvml}\n",
            EXIT_LIB_RM_VERSION_MISMATCH,
        )
    state["driver_version"] = driver
    state["cuda_version"] = str(state.get("cuda_version") or _CUDA_BY_BRANCH.get(driver.partition(".")[0], "13.0"))
    return state


def lost_lines(gpus: list[Gpu]) -> str:
    """What the real tool prints for each GPU that fell off the bus (a GPU the fault knob marks
    ``lost``): "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error" (driver
    520 and later: NVIDIA/open-gpu-kernel-modules#387, pdbear/syno_nvidia_gpu_driver#22; older
    drivers said "GPU is lost. Reboot the system to recover this GPU")."""
    out = []
    for g in gpus:
        domain, _, rest = g["pci_bus_id"].partition(":")
        out.append(f"Unable to determine the device handle for GPU{domain[-4:]}:{rest}: Unknown Error\n")
    return "".join(out)


def _selected(state: dict[str, Any], ids: str | None) -> list[Gpu]:
    gpus: list[Gpu] = state["gpus"]
    if ids is None:
        return gpus
    out = []
    for given in ids.split(","):
        wanted = given.strip()
        match = [g for g in gpus if wanted in (str(g["index"]), g["uuid"], g["pci_bus_id"], g["serial"])]
        if not match:
            raise Fail("No devices were found\n", EXIT_NOT_FOUND)
        out += match
    return out


def table(state: dict[str, Any]) -> str:
    driver, cuda = state["driver_version"], state["cuda_version"]
    rule = "+-----------------------------------------+------------------------+----------------------+"
    lines = [
        time.strftime("%a %b %e %H:%M:%S %Y") + "       ",
        "+" + "-" * 89 + "+",
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
        rule,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for g in state["gpus"]:
        power = f"{round(g['power_idle_w']):>3}W / {g['power_limit_w']:>4}W"
        lines += [
            f"| {g['index']:>3}  {g['name']:<31}{'On':<3} | {g['pci_bus_id']:>18} {'Off':>3} | {'0':>20} |",
            f"| {'N/A':>3}  {str(g['temperature_c']) + 'C':>4}    {'P0':<2}{power:>24} |"
            f" {'0MiB':>10} / {str(g['memory_total_mib']) + 'MiB':>9} | {'0%':>7}{'Default':>13} |",
            f"|{'':41}|{'':24}| {'Disabled':>20} |",
            rule,
        ]
    lines += [
        "",
        "+" + "-" * 89 + "+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
        "|  No running processes found                                                             |",
        "+" + "-" * 89 + "+",
    ]
    return "\n".join(lines) + "\n"


def list_gpus(state: dict[str, Any]) -> str:
    return "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in state["gpus"])


def version(state: dict[str, Any]) -> str:
    driver = state["driver_version"]
    nvml = ".".join(driver.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {driver}\nNVML version        : {nvml}\n"
        f"DRIVER version      : {driver}\nCUDA Version        : {state['cuda_version']}\n"
    )


def query(state: dict[str, Any], gpus: list[Gpu]) -> str:
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Timestamp':<42}: {time.strftime('%a %b %e %H:%M:%S %Y')}",
        f"{'Driver Version':<42}: {state['driver_version']}",
        f"{'CUDA Version':<42}: {state['cuda_version']}",
        "",
        f"{'Attached GPUs':<42}: {len(state['gpus'])}",
    ]
    for g in gpus:
        free = g["memory_total_mib"] - g["memory_reserved_mib"]
        lines += [
            f"GPU {g['pci_bus_id']}",
            f"    {'Product Name':<38}: {g['name']}",
            f"    {'Persistence Mode':<38}: Enabled",
            f"    {'Serial Number':<38}: {g['serial']}",
            f"    {'GPU UUID':<38}: {g['uuid']}",
            f"    {'Minor Number':<38}: {g['index']}",
            f"    {'VBIOS Version':<38}: {g['vbios_version']}",
            "    FB Memory Usage",
            f"        {'Total':<34}: {g['memory_total_mib']} MiB",
            f"        {'Reserved':<34}: {g['memory_reserved_mib']} MiB",
            f"        {'Used':<34}: 0 MiB",
            f"        {'Free':<34}: {free} MiB",
            "",
        ]
    return "\n".join(lines) + "\n"


def _csv(header: list[str], rows: list[list[str]], options: set[str]) -> str:
    out = [] if "noheader" in options else [", ".join(header)]
    for row in rows:
        values = row
        if "nounits" in options:
            values = [v.rsplit(" ", 1)[0] if v.endswith((" MiB", " W", " MHz", " %")) else v for v in row]
        out.append(", ".join(values))
    return "".join(line + "\n" for line in out)


def _format_options(fmt: str | None) -> set[str]:
    if fmt is None:
        raise Fail("ERROR: Option --format is required when querying.\n", EXIT_INVALID_ARGUMENT)
    options = {o.strip() for o in fmt.split(",") if o.strip()}
    if "csv" not in options or not options <= {"csv", "noheader", "nounits"}:
        raise Fail(f'"{fmt}" is not a valid format.\n', EXIT_INVALID_ARGUMENT)
    return options


def query_gpu(state: dict[str, Any], gpus: list[Gpu], fields: str, fmt: str | None) -> str:
    known = _fields(state)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    header: list[str] = []
    getters = []
    for name in names:
        canonical = _ALIASES.get(name, name)
        if canonical not in known:
            raise Fail(f'Field "{name}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT)
        unit, getter = known[canonical]
        header.append(canonical + unit)
        getters.append(getter)
    options = _format_options(fmt)
    return _csv(header, [[get(g) for get in getters] for g in gpus], options)


def query_apps(fields: str, fmt: str | None) -> str:
    names = [f.strip() for f in fields.split(",") if f.strip()]
    for name in names:
        if name not in _APP_FIELDS:
            raise Fail(f'Field "{name}" is not a valid field to query.\n\n', EXIT_INVALID_ARGUMENT)
    # No process ever runs on a fake accelerator.
    return _csv([n + _APP_FIELDS[n] for n in names], [], _format_options(fmt))


def topo(state: dict[str, Any]) -> str:
    gpus: list[Gpu] = state["gpus"]
    layout: dict[str, Any] = state["topology"]
    nics: list[str] = layout["nics"]
    n = len(gpus)
    columns = [f"GPU{i}" for i in range(n)] + [f"NIC{i}" for i in range(len(nics))]
    lines = ["\t" + "\t".join([*columns, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i, g in enumerate(gpus):
        cells = [" X " if j == i else layout["link"] for j in range(n)] + list(layout["gpu_nic"][i])
        affinity = f"{g['cpu_affinity']}\t{g['numa_affinity']}\t\t{g['gpu_numa_id']}"
        lines.append(f"GPU{i}\t" + "\t".join([*cells, affinity]))
    for k in range(len(nics)):
        cells = [layout["gpu_nic"][i][k] for i in range(n)]
        cells += [" X " if m == k else layout["nic_nic"][k][m] for m in range(len(nics))]
        lines.append(f"NIC{k}\t" + "\t".join(cells))
    text = "\n".join(lines) + "\n" + _LEGEND
    if nics:
        text += "\nNIC Legend:\n\n" + "".join(f"  NIC{k}: {name}\n" for k, name in enumerate(nics))
    return text


def _options(argv: list[str]) -> dict[str, str]:
    """``--name=value``, ``--name value`` and short options, by long name; unknown ones fail like the real tool."""
    takes_value = {"--query-gpu", "--query-compute-apps", "--format", "--id", "--display"}
    short = {"-L": "--list-gpus", "-q": "--query", "-i": "--id", "-h": "--help", "-d": "--display", "-m": "--matrix"}
    flags = {"--list-gpus", "--query", "--help", "--version", "--matrix"}
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        name, eq, value = token.partition("=")
        name = short.get(name, name)
        if name in takes_value:
            if not eq:
                if i >= len(argv):
                    raise Fail(f"ERROR: Option {token} requires a value.\n", EXIT_INVALID_ARGUMENT)
                value = argv[i]
                i += 1
            out[name] = value
        elif name in flags and not eq:
            out[name] = ""
        else:
            message = f"ERROR: Option {token} is not recognized. Please run 'nvidia-smi -h' for help.\n"
            raise Fail(message, EXIT_INVALID_ARGUMENT)
    return out


def run(argv: list[str]) -> str:
    if argv[:1] == ["topo"]:
        if argv[1:] not in (["-m"], ["--matrix"]):
            raise Fail(
                "ERROR: Option " + " ".join(argv[1:2] or ["(none)"]) + " is not recognized. "
                "Please run 'nvidia-smi topo -h' for help.\n",
                EXIT_INVALID_ARGUMENT,
            )
        return topo(load())
    options = _options(argv)
    if "--help" in options:
        return "NVIDIA System Management Interface (stand-in of the kimi-deploy local cluster)\n"
    state = load()
    gpus = _selected(state, options.get("--id"))
    fmt = options.get("--format")
    # The first option present picks the report, in the real tool's order of precedence.
    reports: list[tuple[str, Callable[[], str]]] = [
        ("--version", lambda: version(state)),
        ("--list-gpus", lambda: list_gpus(state)),
        ("--query-gpu", lambda: query_gpu(state, gpus, options["--query-gpu"], fmt)),
        ("--query-compute-apps", lambda: query_apps(options["--query-compute-apps"], fmt)),
        ("--query", lambda: query(state, gpus)),
    ]
    lost = [g for g in state["gpus"] if g.get("lost")]
    if lost:
        # The table, -L and -q print the lost GPU's line alone (GlennWood/mining
        # README/troubleshooting.md: "all other GPUs are still running fine", nvidia-smi printing
        # only the error); a query prints it before the other GPUs' rows. Either exits 15.
        state["gpus"] = [g for g in state["gpus"] if not g.get("lost")]
        gpus = [g for g in gpus if not g.get("lost")]
        rows = query_gpu(state, gpus, options["--query-gpu"], fmt) if "--query-gpu" in options else ""
        raise Fail(lost_lines(lost) + rows, EXIT_GPU_IS_LOST)
    for option, report in reports:
        if option in options:
            return report()
    return table(state)


def main() -> None:
    try:
        out = run(sys.argv[1:])
    except Fail as exc:
        # The real tool prints its errors on stdout.
        sys.stdout.write(exc.text)
        sys.exit(exc.status)
    sys.stdout.write(out)


if __name__ == "__main__":
    main()
