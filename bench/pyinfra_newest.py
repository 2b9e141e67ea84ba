"""The unit tier against the newest pyinfra on the index, beyond the minor series pyproject pins.

    python bench/pyinfra_newest.py

kimi-deploy uses pyinfra's internals beside its API (State.pool, the fact pool, get_op_meta,
make_inventory_from_files), so pyproject.toml pins pyinfra to the minor series they were read
from. This makes a fresh virtual environment with this checkout and the lab, then the newest
pyinfra release (``pip install --upgrade pyinfra``, the pin overridden), runs the unit tier
(``-m "not processes"``) and prints the pinned and the newest version with pytest's summary: the
figure to read before widening the pin.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _version(python: Path) -> str:
    return subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('pyinfra'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "-e", f"{ROOT}[dev]", "-e", str(ROOT / "lab")], check=True)
        pinned = _version(venv / "bin" / "python")
        subprocess.run([*pip, "--upgrade", "pyinfra"], check=True)
        newest = _version(venv / "bin" / "python")
        run = subprocess.run(
            [str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "-m", "not processes", "tests"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        summary = (run.stdout.strip().splitlines() or ["no output"])[-1]
        print(f"pyinfra pinned {pinned}, newest {newest}: unit tier {summary} (exit {run.returncode})")
        return run.returncode


if __name__ == "__main__":
    sys.exit(main())
