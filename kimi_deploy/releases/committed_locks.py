"""Release locks kept beside the recipe, like its weights locks and like ``uv.lock``.

A recipe that names its hosts' OS (``os:``) has each release of each topology locked before any
host is touched, for the platform that OS gives those hosts (``kimi_deploy.releases.host_os``)::

    recipes/locks/releases/<release>@<platform>.txt
    recipes/locks/releases/vllm-0.33.0+fastsafetensors-0.5.0@cp312-aarch64-glibc2.39.txt

``kimi-deploy lock RECIPE --releases`` resolves them with the controller's uv against the index
(``kimi_deploy.releases.lock.resolve``: the whole closure, wheels only, with hashes) and writes
them; commit them. ``validate`` refuses a recipe whose locks are missing or stale (other pins,
another platform), and the converge installs exactly the committed text on every host of that
topology, after its probe shows the host runs that platform.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_lock import check_lock
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.lock import WITHOUT_HEADER, HostPlatform, LockError, resolve
from kimi_deploy.releases.venvs import CommittedLock, VenvRelease, topology_releases

RELEASE_LOCK_DIR = "recipes/locks/releases"
_LOCK_HINT = "run `kimi-deploy lock RECIPE --releases` and commit what it writes"


@dataclass(frozen=True)
class Needed:
    """One lock a recipe needs: a release for a platform, and the topologies that install it."""

    release: VenvRelease
    platform: HostPlatform
    topologies: tuple[str, ...]

    def path(self, base: Path | None = None) -> Path:
        return lock_file(self.release, self.platform, base)


def lock_file(release: VenvRelease, platform: HostPlatform, base: Path | None = None) -> Path:
    """Where the lock of ``release`` for ``platform`` is kept."""
    return (base or Path(".")) / RELEASE_LOCK_DIR / f"{release.name}@{platform.name}.txt"


def needed(recipe: Recipe, topologies: Sequence[str] | None = None) -> list[Needed]:
    """Every lock the recipe needs (of ``topologies``, default all): each release of each topology
    whose hosts' OS it names, for that OS's platform, in the order the topologies name them."""
    found: dict[tuple[str, HostPlatform], Needed] = {}
    for name in recipe.topologies:
        if topologies is not None and name not in topologies:
            continue
        platform = recipe.platform(name)
        if platform is None:
            continue
        for release in topology_releases(recipe, name):
            key = (release.name, platform)
            have = found.get(key)
            found[key] = Needed(release, platform, (*have.topologies, name) if have else (name,))
    return list(found.values())


def _check(text: str, release: VenvRelease, platform: HostPlatform, where: str) -> None:
    """``ConfigError`` when the lock at ``where`` is not one of ``release`` for ``platform``."""
    try:
        check_lock(text, release.requirements)
    except ValueError as exc:
        raise ConfigError(where, "", f"stale: {exc}; {_LOCK_HINT}") from None
    headers = [line for line in text.splitlines() if line.startswith("# ")]
    tag = f"# platform: {platform.tag}"
    if tag not in headers:
        raise ConfigError(where, "", f"stale: not a lock for {platform.tag}; {_LOCK_HINT}")
    without = next((line[len(WITHOUT_HEADER) :] for line in headers if line.startswith(WITHOUT_HEADER)), "")
    if without != ", ".join(release.without):
        leaves = ", ".join(release.without)
        what = f"stale: locked without [{without}], the recipe leaves out [{leaves}]"
        raise ConfigError(where, "", f"{what}; {_LOCK_HINT}")


def read(want: Needed, base: Path | None = None) -> CommittedLock:
    """The committed lock ``want`` names, checked; ``ConfigError`` in one line when it is missing
    or stale."""
    path = want.path(base)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        what = f"no lock of {want.release.name} for {want.platform.described} (topologies {', '.join(want.topologies)})"
        raise ConfigError(str(path), "", f"{what}: {_LOCK_HINT}") from None
    _check(text, want.release, want.platform, str(path))
    return CommittedLock(text, want.platform, str(path))


def problems(recipe: Recipe, base: Path | None = None, topologies: Sequence[str] | None = None) -> list[str]:
    """What ``validate`` says of the recipe's committed locks (of ``topologies``, default all): one
    line for each missing or stale."""
    out = []
    for want in needed(recipe, topologies):
        try:
            read(want, base)
        except ConfigError as exc:
            out.append(str(exc))
    return out


def with_committed(
    recipe: Recipe, topology: str, releases: list[VenvRelease], base: Path | None = None
) -> list[VenvRelease]:
    """``releases`` of a host of ``topology`` with their committed locks, when the recipe names
    that topology's OS (``ConfigError`` when one is missing or stale); as they are otherwise."""
    platform = recipe.platform(topology)
    if platform is None:
        return releases
    return [replace(r, committed=read(Needed(r, platform, (topology,)), base)) for r in releases]


def lock_all(
    recipe: Recipe, index_url: str, environ: Mapping[str, str], base: Path | None = None
) -> tuple[list[Path], list[str]]:
    """Resolve and write every lock the recipe needs (an unchanged one is left as it is): the
    files written or kept, and one line for each release that does not resolve."""
    kept: list[Path] = []
    refused: list[str] = []
    for want in needed(recipe):
        path = want.path(base)
        try:
            read(want, base)
            kept.append(path)
            continue
        except ConfigError:
            pass
        release = want.release
        try:
            text = resolve(release.requirements, release.without, index_url, want.platform, environ)
        except LockError as exc:
            refused.append(f"{release.name} for {want.platform.described} ({', '.join(want.topologies)}): {exc}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        kept.append(path)
    return kept, refused
