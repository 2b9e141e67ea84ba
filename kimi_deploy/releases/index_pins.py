"""Whether a package index has every release a recipe pins, asked from the controller before a
converge (``kimi-deploy validate --index URL``).

A host refuses a pin its index lacks only when it installs the release, in the middle of a
converge; this asks the index's project pages (PEP 503) once per project, and names each pin it
lacks with the newest version it has. It says whether a version is listed, not whether its wheels
install on the hosts (their Python: the preflight's gate; their platform).
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.version import InvalidVersion, Version

from kimi_deploy.hostside.boundary_index import project_versions
from kimi_deploy.recipe import Recipe

# field of the recipe, distribution, version
Pin = tuple[str, str, str]


def recipe_pins(recipe: Recipe) -> list[Pin]:
    """Every distribution the recipe pins, with the field that pins it."""
    pins: list[Pin] = []
    for engine, release in recipe.engines.items():
        pins.append((f"engines.{engine}.version", release.distribution(engine), release.version))
        pins += [(f"engines.{engine}.packages.{n}", n, v) for n, v in sorted(release.packages.items())]
    for kind, releases in (("routers", recipe.routers), ("stores", recipe.stores)):
        for package, other in releases.items():
            pins.append((f"{kind}.{package}.version", package, other.version))
            pins += [(f"{kind}.{package}.packages.{n}", n, v) for n, v in sorted(other.packages.items())]
    pins += [(f"tools.{name}", name, version) for name, version in sorted(recipe.tools.model_dump().items())]
    return pins


def _newest(versions: list[str]) -> str | None:
    """The newest final release of ``versions``, else the newest pre-release; None: none parse."""
    parsed = []
    for v in versions:
        try:
            parsed.append(Version(v))
        except InvalidVersion:
            continue
    finals = [v for v in parsed if not v.is_prerelease]
    best = max(finals or parsed, default=None)
    return None if best is None else str(best)


def missing_pins(
    recipe: Recipe, index_url: str, versions_of: Callable[[str, str], list[str] | None] = project_versions
) -> list[str]:
    """One line per pin ``index_url`` does not list (or per project it does not answer for)."""
    listed: dict[str, list[str] | None] = {}
    lines: list[str] = []
    for field, package, version in recipe_pins(recipe):
        if package not in listed:
            listed[package] = versions_of(index_url, package)
        have = listed[package]
        if have is None:
            lines.append(f"{field}: package index {index_url} does not answer for {package}")
            continue
        if any(_same(v, version) for v in have):
            continue
        newest = _newest(have)
        found = f"newest: {newest}" if newest else "it lists no version of it"
        lines.append(f"{field}: {package}=={version} is not on {index_url} ({found})")
    return lines


def _same(listed: str, pinned: str) -> bool:
    """Whether the index's version is the pin (PEP 440: 0.5 == 0.5.0)."""
    try:
        return Version(listed) == Version(pinned)
    except InvalidVersion:
        return listed == pinned
