"""Device check: what the watchdog reads of a real NVIDIA GPU, and whether the local cluster's
stand-in nvidia-smi prints the same fields the same way.

    python3 tests/device/check_watchdog.py

Prints ``nvidia-smi``'s answer to the watchdog's query (``hostside.watchdog.FIELD_LISTS``' first,
with the fabric's state, no header, no units) and to the same query with a header, then the watchdog's reading
(``hostside.watchdog.accelerators``) of this machine with the count ``nvidia-smi -L`` lists.
Exits 1 when the watchdog finds a fault on a healthy machine, or counts otherwise than
``nvidia-smi -L``. Stdlib only; takes about a second; CI does not run it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kimi_deploy.hostside.watchdog import FIELD_LISTS, accelerators  # noqa: E402

FIELDS = FIELD_LISTS[0]


def main() -> int:
    for fmt in ("csv,noheader,nounits", "csv"):
        run = subprocess.run(
            ["nvidia-smi", f"--query-gpu={FIELDS}", f"--format={fmt}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        print(f"$ nvidia-smi --query-gpu={FIELDS} --format={fmt}   (exit {run.returncode})")
        print(run.stdout + run.stderr)
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    found = accelerators({"count": count}, 30)
    print(f"nvidia-smi -L: {count} GPUs; the watchdog reads: {found}")
    ok = found["count"] == count and found["fault"] is None
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
