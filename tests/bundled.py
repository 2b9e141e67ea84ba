"""Host programs as the hosts run them: bundled with the ``hostside`` modules they import."""

from __future__ import annotations

from pathlib import Path

from kimi_deploy.host.command import bundle


def bundled_program(script: str, folder: Path) -> Path:
    """``hostside/<script>`` written as one file into ``folder``, ready for ``python FILE``."""
    path = folder / f"bundled-{script}"
    path.write_text(bundle(script), encoding="utf-8")
    return path
