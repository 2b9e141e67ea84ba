"""What the cluster's package index serves: stand-in engine wheels and the demo's real tools."""

from __future__ import annotations

from pathlib import Path

from localcluster import pypi_mirror, wheels


def build(root: Path) -> list[Path]:
    """Stand-in engines (built here) and the demo recipe's pinned tools (from PyPI, cached)."""
    return [*wheels.build_all(root), *pypi_mirror.mirror(root / "files")]
