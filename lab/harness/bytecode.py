"""The project's modules compiled as a wheel's install leaves them, before a timed run.

pip compiles a wheel's modules when it installs them. A checkout installed in place (``pip install
-e``, the lab's) is not, and pyinfra never writes bytecode (``pyinfra_cli/main.py`` sets
``sys.dont_write_bytecode``): every ``pyinfra`` run would compile again each of our modules that no
other process has compiled since its last change (measured: some 50 to 80 ms of the controller's
serial start). The benchmarks time the deploy as an install runs it.
"""

from __future__ import annotations

import compileall
import os

from harness.own_cluster import ROOT

PACKAGES = ("kimi_deploy", "kimi_pyinfra", "deploys")


def compiled() -> None:
    """Compile the project's packages into their ``__pycache__``, as pip does for a wheel, and let
    the runs this process starts keep what they compile (no ``PYTHONDONTWRITEBYTECODE``)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    for package in PACKAGES:
        compileall.compile_dir(str(ROOT / package), quiet=1)
