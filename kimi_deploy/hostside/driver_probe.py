"""What the drivers step decides on, read in one round-trip: prints one JSON line.

Stdlib only, Python 3.10+. Input: one argument, base64 of zlib-compressed JSON (every key optional):
  {"nvidia": bool: ask nvidia-smi which driver NVML runs, "services": [unit], "files": [path],
   "sysctl": [key such as "vm.max_map_count"], "timeout_s": float (default 10)}

Output:
  {"os": {"id", "version_id", "pretty", "arch": dpkg's architecture | None},
   "kernel": "6.1.0-26-amd64", "headers": bool (the running kernel's build tree, what DKMS needs),
   "packages": {name: {"version": "580.95.05-1", "held": bool}}   (installed NVIDIA and CUDA packages),
   "sources": ["deb [signed-by=...] https://.../debian12/x86_64/ /"]  (the lines of cuda-* apt sources),
   "module": "580.95.05" | None   (the loaded kernel module's version),
   "nvml": {"version": "580.95.05"} | {"error": "Failed to initialize NVML: ..."} | None (no nvidia-smi),
   "reboot_required": ["nvidia-driver-cuda", ...] | None (no reboot asked for),
   "services": {unit: {"active": "active", "enabled": "enabled" | "" (no such unit)}},
   "files": {path: sha256 | None}, "owners": {path: "owner:group:octal mode" | None},
   "sysctl": {key: value | None}, "boot_id": str,
   "secure_boot": {"enabled": bool | None, "keys": {path: "enrolled" | "not enrolled" | "missing" |
                   "unknown: ..."}} | None   (asked with "secure_boot": [DKMS signing key paths])}
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.shared_queries import (
    NVIDIA_PACKAGES,
    SERVICE_STATES,
    blocks,
    file_sha256,
    installed,
    on_path,
    owner_mode,
)

# Names for type checkers only: typing and the answers' types cost every probe ~10 ms to import
# (kimi_deploy/host/command.py leaves this block's hostside modules out of the bundle).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from kimi_deploy.hostside.probe_types import DriversAnswer, Nvml, SecureBoot, ServiceState
    from kimi_deploy.hostside.unit_show import UnitShow


SOURCES_DIR = "/etc/apt/sources.list.d"
EFI_DIR = "/sys/firmware/efi"
# UEFI's global variable (UEFI spec, "Globally Defined Variables"): 4 bytes of attributes, then 1
# when Secure Boot is on.
SECURE_BOOT_VAR = "efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e9e2e6c2dd3b"
_NVRM = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)\s")
_ENV = {**os.environ, "LC_ALL": "C", "LANG": "C"}


def _text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _start(argv: list[str]) -> subprocess.Popen[str] | None:
    found = on_path(argv[0])
    if found is None:
        return None
    return subprocess.Popen(
        [found, *argv[1:]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_ENV,
    )


def _finish(proc: subprocess.Popen[str] | _Read | None, timeout: float) -> tuple[int | None, str, str]:
    if proc is None:
        return None, "", ""
    if isinstance(proc, _Read):
        return proc.answer
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, f"timed out after {timeout:g} s"
    return proc.returncode, out, err


def _os_release() -> dict[str, str | None]:
    values: dict[str, str | None] = {"id": None, "version_id": None, "pretty": None}
    for line in (_text("/etc/os-release") or _text("/usr/lib/os-release") or "").splitlines():
        key, _, value = line.partition("=")
        name = {"ID": "id", "VERSION_ID": "version_id", "PRETTY_NAME": "pretty"}.get(key.strip())
        if name:
            values[name] = value.strip().strip("\"'")
    return values


def _sources() -> list[str]:
    lines = []
    try:
        names = sorted(n for n in os.listdir(SOURCES_DIR) if n.startswith("cuda"))
    except OSError:
        names = []
    for name in names:
        for line in (_text(os.path.join(SOURCES_DIR, name)) or "").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                lines.append(line.strip())
    return lines


def _module() -> str | None:
    version = (_text("/sys/module/nvidia/version") or "").strip()
    if version:
        return version
    match = _NVRM.search(_text("/proc/driver/nvidia/version") or "")
    return match.group(1) if match else None


def _nvml(rc: int | None, out: str, err: str) -> Nvml:
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if rc == 0 and lines:
        return {"version": lines[0]}
    said = lines + [line.strip() for line in err.splitlines() if line.strip()]
    return {"error": said[0] if said else f"nvidia-smi exited with status {rc}"}


def _services(units: list[str], stdout: str) -> dict[str, ServiceState]:
    found: dict[str, ServiceState] = {}
    for props in blocks(stdout):
        unit = props.get("Id", "").removesuffix(".service")
        if unit in units:
            found[unit] = {"active": props.get("ActiveState", ""), "enabled": props.get("UnitFileState", "")}
    return {u: found.get(u, {"active": "unknown", "enabled": ""}) for u in units}


def secure_boot(keys: list[str], timeout: float, efi_dir: str = EFI_DIR) -> SecureBoot:
    """Whether Secure Boot is on and, when it is, whether ``mokutil --test-key`` finds each key
    enrolled (a machine booted without UEFI, or whose firmware has no such variable, has it off).
    mokutil prints ``<key> is already enrolled`` (also when its enrollment waits for the next boot)
    or ``<key> is not enrolled`` (lcp/mokutil src/mokutil.c, test_key)."""
    if not os.path.isdir(efi_dir):
        return {"enabled": False, "keys": {}}
    try:
        with open(os.path.join(efi_dir, SECURE_BOOT_VAR), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {"enabled": False, "keys": {}}
    except OSError:
        return {"enabled": None, "keys": {}}
    if len(data) < 5 or data[4] != 1:
        return {"enabled": False, "keys": {}}
    found: dict[str, str] = {}
    for key in keys:
        if not os.path.exists(key):
            found[key] = "missing"
            continue
        rc, out, err = _finish(_start(["mokutil", "--test-key", key]), timeout)
        said = " ".join((out + err).split())
        if "is already enrolled" in said:
            found[key] = "enrolled"
        elif "is not enrolled" in said:
            found[key] = "not enrolled"
        else:
            found[key] = f"unknown: {said or ('mokutil is not installed' if rc is None else f'mokutil exited {rc}')}"
    return {"enabled": True, "keys": found}


def _digest(path: str) -> str | None:
    return file_sha256(path)


def driver_version_read(hardware: Any) -> tuple[int | None, str, str] | None:
    """What ``nvidia-smi --query-gpu=driver_version`` would answer, from the hardware probe's
    answer of the same moment (hostside/hardware_probe.py, run first in the same process by
    hostside/host_probe.py): NVML's driver version, or the driver_version column of its own
    nvidia-smi query, or its error as nvidia-smi said it. None: it read neither (no nvidia-smi,
    or it failed): ask nvidia-smi here."""
    nvidia = hardware.get("nvidia") if isinstance(hardware, dict) else None
    if not isinstance(nvidia, dict):
        return None
    nvml = nvidia.get("nvml")
    if isinstance(nvml, dict) and "error" not in nvml and nvml.get("driver_version"):
        return 0, f"{nvml['driver_version']}\n", ""
    query, fields = nvidia.get("smi_query"), nvidia.get("smi_fields") or []
    if not isinstance(query, dict) or query.get("rc") is None or "driver_version" not in fields:
        return None
    if query["rc"] != 0:
        return query["rc"], str(query.get("stdout") or ""), str(query.get("stderr") or "")
    column = fields.index("driver_version")
    rows = [line.split(", ") for line in str(query.get("stdout") or "").splitlines() if line.strip()]
    if any(len(row) != len(fields) for row in rows):
        return None
    return 0, "".join(f"{row[column].strip()}\n" for row in rows), ""


def read_already(hardware: Any, argv: list[str]) -> tuple[int | None, str, str] | None:
    """What ``argv`` answered when the hardware probe of the same moment ran exactly that command
    (its ``drivers`` section: dpkg-query, systemctl); None: it ran another, or it got no answer."""
    drivers = hardware.get("drivers") if isinstance(hardware, dict) else None
    for run in drivers.values() if isinstance(drivers, dict) else []:
        if isinstance(run, dict) and run.get("argv") == argv and run.get("rc") is not None and not run.get("error"):
            return run["rc"], str(run.get("stdout") or ""), str(run.get("stderr") or "")
    return None


class _Read:
    """A command's answer read already (``read_already``), in the shape ``_finish`` takes."""

    def __init__(self, answer: tuple[int | None, str, str]) -> None:
        self.answer = answer


def _started(argv: list[str], hardware: Any) -> subprocess.Popen[str] | _Read | None:
    read = read_already(hardware, argv)
    return _Read(read) if read is not None else _start(argv)


def _services_shown(argv: list[str], hardware: Any, shown: UnitShow | None) -> subprocess.Popen[str] | _Read | None:
    """``systemctl show`` of the services: the hardware part's, else cut out of the host probe's
    one (``shown``, hostside/unit_show.py) when it can say what it would print, else run here."""
    read = read_already(hardware, argv)
    if read is None and shown is not None and on_path(argv[0]) is not None:
        stdout = shown.answer(argv[2].removeprefix("--property=").split(","), argv[3:])
        read = (0, stdout, "") if stdout is not None else None
    return _Read(read) if read is not None else _start(argv)


def probe(
    request: dict[str, Any],
    known: tuple[int | None, str, str] | None = None,
    hardware: Any = None,
    shown: UnitShow | None = None,
) -> DriversAnswer:
    """What the drivers step decides on. ``known``: nvidia-smi's driver version read already in
    this process (``driver_version_read``), so that nvidia-smi runs once per probe; ``hardware``:
    the hardware probe's answer of the same moment, whose dpkg-query and systemctl it takes when
    they were its own commands (``read_already``); ``shown``: the host probe's one ``systemctl
    show``, which answers this part's when it can (hostside/unit_show.py)."""
    timeout = float(request.get("timeout_s") or 10)
    units = [str(u) for u in request.get("services") or []]
    kernel = os.uname().release
    dpkg = _started(NVIDIA_PACKAGES, hardware)
    arch = _start(["dpkg", "--print-architecture"])
    nvidia = bool(request.get("nvidia"))
    ask = nvidia and known is None
    smi = _start(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if ask else None
    show = _services_shown([*SERVICE_STATES, *units], hardware, shown) if units else None
    pending = _text("/run/reboot-required.pkgs")
    keys = request.get("secure_boot")
    # nvidia-smi's answer: read here, or already (``known``); None: not asked, or no nvidia-smi
    read = known if nvidia and known is not None else (_finish(smi, timeout) if smi is not None else None)
    release = _os_release()
    return {
        "os": {
            "id": release["id"],
            "version_id": release["version_id"],
            "pretty": release["pretty"],
            "arch": _finish(arch, timeout)[1].strip() or None,
        },
        "kernel": kernel,
        "headers": os.path.isdir(f"/lib/modules/{kernel}/build"),
        "packages": installed(_finish(dpkg, timeout)[1]),
        "sources": _sources(),
        "module": _module(),
        "nvml": _nvml(*read) if read is not None else None,
        "reboot_required": (pending or "").split() if os.path.exists("/run/reboot-required") else None,
        "services": _services(units, _finish(show, timeout)[1]),
        "files": {str(p): _digest(str(p)) for p in request.get("files") or []},
        "owners": {str(p): owner_mode(str(p)) for p in request.get("files") or []},
        "sysctl": {
            str(k): (_text("/proc/sys/" + str(k).replace(".", "/")) or "").strip() or None
            for k in request.get("sysctl") or []
        },
        "boot_id": (_text("/proc/sys/kernel/random/boot_id") or "").strip(),
        "secure_boot": secure_boot([str(k) for k in keys], timeout) if keys is not None else None,
    }


def main() -> None:
    try:
        result: DriversAnswer | dict[str, str] = probe(read_request())
    except Exception as exc:  # noqa: BLE001 - whatever happens, the caller gets one JSON line
        result = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
