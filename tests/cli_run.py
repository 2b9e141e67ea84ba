"""The ``kimi-deploy`` command as a user runs it: a subprocess from the repository root."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.conftest import ROOT


def kimi(
    *args: str, memory_bytes: int | None = None, cwd: Path = ROOT, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``kimi-deploy ARGS`` from the repository root (or ``cwd``), optionally under an
    address-space limit, with ``env`` added to the environment."""

    def limit() -> None:
        if memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        preexec_fn=limit,
    )
