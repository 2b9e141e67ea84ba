"""What the cluster's package index serves: stand-in engine wheels, the demo's real tools, real
engine releases and real routers, and any more real packages a test asks for.

``KIMI_CLUSTER_PACKAGES`` (pip requirements, space or comma separated, e.g. ``torch==2.13.0``) adds
real packages and their dependencies, downloaded once on the controller with pip (which also takes
the files in pip's own ``find-links``) and cached like the demo's tools.
"""

from __future__ import annotations

import os
from pathlib import Path

from kimi_deploy.hostside.boundary_lock import lock_pins
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.releases import committed_locks
from localcluster import CHECKOUT, pypi_mirror, wheels


def extra_packages(environ: dict[str, str] | None = None) -> list[str]:
    """The requirements named in ``KIMI_CLUSTER_PACKAGES``, in order, without repeats."""
    raw = (os.environ if environ is None else environ).get("KIMI_CLUSTER_PACKAGES", "")
    return list(dict.fromkeys(r for r in raw.replace(",", " ").split() if r))


def locked_pins(lock: Path) -> list[str]:
    """The real packages a committed release lock pins (its stand-ins left out), as the index
    downloads them: exactly, dependencies not resolved again (``pypi_mirror.download(...,
    no_deps=True)``)."""
    pins = lock_pins(lock.read_text(encoding="utf-8"))
    return sorted(f"{name}=={version}" for name, version in pins.items() if name not in wheels.PROJECTS)


def _locked_sets() -> tuple[list[list[str]], set[str]]:
    """The pins of each committed lock of the demo recipe (its hosts' OS named: each release's whole
    closure, as the hosts install it), stand-ins left out; and the requirements they cover. The
    index serves exactly what the locks pin: PyPI's newest releases of their dependencies may be
    newer than the locks by now."""
    recipe = load_recipe(pypi_mirror.DEMO_RECIPE)
    sets: list[list[str]] = []
    covered: set[str] = set()
    for want in committed_locks.needed(recipe):
        path = want.path(CHECKOUT)
        if not path.is_file():
            continue
        sets.append(locked_pins(path))
        covered.update(want.release.requirements)
    return [wanted for wanted in sets if wanted], covered


def _real_sets() -> list[tuple[list[str], bool]]:
    """The sets of real packages the index serves, each downloaded (and cached) as one, with
    whether it is a lock's closure (downloaded as pinned, dependencies not resolved again): a new
    router pin leaves the engines' cache as it is."""
    locked, covered = _locked_sets()
    resolved = [
        [r for r in wanted if r not in covered]
        for wanted in (
            pypi_mirror.requirements(),
            pypi_mirror.real_engines(set(wheels.PROJECTS)),
            pypi_mirror.real_routers(),
            extra_packages(),
        )
    ]
    return [(wanted, True) for wanted in locked] + [(wanted, False) for wanted in resolved if wanted]


def download() -> None:
    """Fetch what the index will serve from PyPI into the cache, ahead of ``build`` (``cluster up``
    runs it while the hosts' base image is made)."""
    for wanted, pinned in _real_sets():
        pypi_mirror.download(wanted, no_deps=pinned)


def build(root: Path) -> list[Path]:
    """Stand-in engines (built here), the demo recipe's pinned tools, its real engine releases and
    its routers (from PyPI, cached)."""
    files = wheels.build_all(root)
    for wanted, pinned in _real_sets():
        files += pypi_mirror.mirror(root / "files", wanted=wanted, no_deps=pinned)
    return files
