"""The ``kimi-deploy`` command as a user runs it: a subprocess from the repository root."""

from __future__ import annotations

import resource
import subprocess
import sys

from tests.conftest import ROOT


def kimi(*args: str, memory_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    """``kimi-deploy ARGS`` from the repository root, optionally under an address-space limit."""

    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        preexec_fn=limit,
    )
