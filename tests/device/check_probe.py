"""Device check: the hardware probe on a real NVIDIA GPU, through NVML and through nvidia-smi.

    python3 tests/device/check_probe.py [--pynvml-dir DIR]

Runs ``hostside/hardware_probe.py`` on this machine twice (NVML through nvidia-ml-py, then the
``nvidia-smi`` fallback), parses both into HostProfiles, and compares them with what
``nvidia-smi --query-gpu`` says directly: GPU count, names, UUIDs, memory, PCI bus ids, compute
capability and driver version. Prints the comparison; exits 1 on any mismatch. Stdlib only, plus
nvidia-ml-py (``pynvml``), taken from ``--pynvml-dir`` (an unpacked wheel) when the machine has no
network. Takes a few seconds; CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kimi_deploy.host.command import hostside_command  # noqa: E402
from kimi_deploy.host.profile import parse_profile  # noqa: E402
from kimi_deploy.host.profile_types import HostProfile  # noqa: E402
from kimi_deploy.parsers.nvidia_smi_query import parse_query  # noqa: E402

FIELDS = ["index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version", "compute_cap"]


def probe(nvml: bool, env: dict[str, str]) -> tuple[HostProfile, float]:
    command = hostside_command(sys.executable, "hardware_probe.py", {"weights_dir": "/tmp", "nvml": nvml})
    started = time.perf_counter()
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True, env=env, timeout=60)
    return parse_profile(json.loads(out.stdout.splitlines()[-1])), time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pynvml-dir", help="a folder holding the pynvml module (unpacked nvidia-ml-py wheel)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.pynvml_dir:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pynvml_dir, env.get("PYTHONPATH")]))

    smi = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    truth = parse_query(smi.stdout, FIELDS)
    problems: list[str] = []
    for nvml in (True, False):
        profile, seconds = probe(nvml, env)
        acc = profile["accelerators"]
        label = f"probe via {acc.get('source')}"
        print(
            f"{label}: {acc.get('count')} x {acc.get('model')}, {acc.get('memory_mib')} MiB, "
            f"driver {acc.get('driver_version')}, CUDA {acc.get('cuda_version')}, {seconds * 1000:.0f} ms"
        )
        if nvml and acc.get("source") != "nvml":
            problems.append(f"{label}: NVML path not taken ({acc.get('error') or (profile.get('errors') or {})})")
        if acc.get("count") != len(truth):
            problems.append(f"{label}: count {acc.get('count')}, nvidia-smi says {len(truth)}")
        for dev, want in zip(acc.get("devices") or [], truth, strict=False):
            for key, smi_key in (
                ("name", "name"),
                ("uuid", "uuid"),
                ("memory_mib", "memory.total"),
                ("pci_bus_id", "pci.bus_id"),
                ("compute_cap", "compute_cap"),
            ):
                got, expected = dev.get(key), want.get(smi_key)
                if str(got).lower().lstrip("0") != str(expected).lower().lstrip("0"):
                    problems.append(f"{label}: GPU{want.get('index')} {key} {got!r}, nvidia-smi says {expected!r}")
        if truth and str(acc.get("driver_version")) != str(truth[0].get("driver_version")):
            problems.append(
                f"{label}: driver {acc.get('driver_version')}, nvidia-smi says {truth[0].get('driver_version')}"
            )
        topo = acc["topology"]
        gpus, nics = (len(topo["gpus"]), len(topo["nics"])) if topo else (0, 0)
        print(f"{label}: topo -m parsed: {gpus} GPUs, {nics} NICs")
    for line in problems:
        print(f"MISMATCH {line}")
    print("probe matches nvidia-smi" if not problems else f"{len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
