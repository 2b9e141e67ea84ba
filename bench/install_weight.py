"""What installing kimi-deploy costs a controller: seconds, packages and megabytes, from its wheel.

    python bench/install_weight.py [--extras plot,ledger]

Builds this checkout's wheel, then installs it into a fresh virtual environment twice: first with
pip's cache off (every package downloaded from the index, as on a new controller), then with the
cache pip filled (a second controller of the same person). Prints, for each, the wall seconds, the
number of distributions installed and the size of site-packages, against the targets (under 30 s,
under 150 MB by default). ``--extras``: the same with these extras (``kimi-deploy[plot]``, ...).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 30.0
TARGET_MB = 150.0


def _size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink()) / 1e6


def _install(wheel: Path, extras: str, work: Path, cached: bool) -> tuple[float, int, float]:
    venv = work / ("venv-cached" if cached else "venv-cold")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    target = f"kimi-deploy[{extras}] @ {wheel.as_uri()}" if extras else str(wheel)
    argv = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", target]
    if not cached:
        argv.insert(3, "--no-cache-dir")
    started = time.monotonic()
    subprocess.run(argv, check=True)
    took = time.monotonic() - started
    listed = subprocess.run(
        [str(venv / "bin" / "pip"), "list", "--format=freeze", "--exclude", "pip"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    (site,) = venv.glob("lib/python*/site-packages")
    return took, len(listed), _size_mb(site)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extras", default="", help="extras to install with the wheel, e.g. plot,ledger")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(work / "dist")],
            check=True,
        )
        (wheel,) = (work / "dist").glob("kimi_deploy-*.whl")
        what = f"kimi-deploy[{args.extras}]" if args.extras else "kimi-deploy"
        print(f"{what} from {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB wheel), Python {sys.version.split()[0]}")
        targets = f"vs targets ({TARGET_S:.0f} s, {TARGET_MB:.0f} MB)"
        print(f"{'pip cache':<10} {'seconds':>8} {'dists':>6} {'MB':>7}   {targets}")
        for cached in (False, True):
            took, count, size = _install(wheel, args.extras, work, cached)
            print(
                f"{'warm' if cached else 'off':<10} {took:>8.1f} {count:>6} {size:>7.1f}"
                f"   {took / TARGET_S:.2f} x, {size / TARGET_MB:.2f} x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
