"""What the cluster's package index serves: stand-in engine wheels, the demo's real tools, real
engine releases and real routers, and any more real packages a test asks for.

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


def _real_sets() -> list[list[str]]:
    """The sets of real packages the index serves, each downloaded (and cached) as one: a new
    router pin leaves the engines' cache as it is."""
    sets = [pypi_mirror.requirements(), pypi_mirror.real_engines(set(wheels.PROJECTS)), pypi_mirror.real_routers()]
    return [wanted for wanted in (*sets, extra_packages()) if wanted]


def download() -> None:
    """Fetch what the index will serve from PyPI into the cache, ahead of ``build`` (``cluster up``
    runs it while the hosts' base image is made)."""
    for wanted in _real_sets():
        pypi_mirror.download(wanted)


def build(root: Path) -> list[Path]:
    """Stand-in engines (built here), the demo recipe's pinned tools, its real engine releases and
    its routers (from PyPI, cached)."""
    files = wheels.build_all(root)
    for wanted in _real_sets():
        files += pypi_mirror.mirror(root / "files", wanted=wanted)
    return files
