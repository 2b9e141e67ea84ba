"""The releases a host installs: one virtual environment per pinned version, named by its pins.

An engine host holds its engine's release (with the recipe's extra packages) and the Hub client's
(weights syncs); a router host its router's and, where the topology's KV cache goes through the
Mooncake store, the Mooncake master's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kimi_deploy.recipe import MOONCAKE_PACKAGE, EngineName, Recipe, RouterName
from kimi_deploy.releases.host_paths import engine_dir, router_dir, store_dir, tool_dir
from kimi_deploy.releases.lock import HostPlatform


@dataclass(frozen=True)
class CommittedLock:
    """A release's lock kept beside the recipe (``kimi_deploy.releases.committed_locks``) for the platform
    the recipe names for the host's topology: what the host installs, when its platform runs it."""

    text: str
    platform: HostPlatform
    path: str


@dataclass(frozen=True)
class VenvRelease:
    package: str
    version: str
    path: str
    requirements: list[str]
    # requirements of the release never installed (``EngineRelease.without``)
    without: list[str] = field(default_factory=list)
    # its committed lock, when the recipe names the host's OS; None: the controller resolves one
    # for the platform the host reports
    committed: CommittedLock | None = None

    @property
    def name(self) -> str:
        """``vllm-0.34.0+fastsafetensors-0.5.0``: its folder's name, every pin in it."""
        return self.path.rsplit("/", 1)[-1]


def venv_release(
    package: str, version: str, packages: Mapping[str, str], path: str, without: Sequence[str] = ()
) -> VenvRelease:
    """The release of ``package`` at ``version`` with its pinned ``packages``, installed at ``path``."""
    requirements = [f"{package}=={version}", *(f"{name}=={pin}" for name, pin in sorted(packages.items()))]
    return VenvRelease(package, version, path, requirements, sorted(without))


def router_releases(recipe: Recipe, topology: str) -> list[VenvRelease]:
    """A router host's releases: its router's, and the Mooncake master's where it keeps one."""
    topo = recipe.topologies[topology]
    assert topo.router is not None
    package: RouterName = topo.router.package
    router = recipe.routers[package]
    releases = [venv_release(package, router.version, router.packages, router_dir(recipe, package))]
    if topo.mooncake_master:
        store = recipe.stores[MOONCAKE_PACKAGE]
        path = store_dir(recipe, MOONCAKE_PACKAGE)
        releases.append(venv_release(MOONCAKE_PACKAGE, store.version, store.packages, path))
    return releases


def engine_releases(recipe: Recipe, engine: EngineName, path: str | None = None) -> list[VenvRelease]:
    """An engine host's releases: the engine's (at ``path``, default its folder) and the Hub client's."""
    release = recipe.engines[engine]
    hub = recipe.tools.huggingface_hub
    return [
        venv_release(
            release.distribution(engine),
            release.version,
            release.packages,
            path or engine_dir(recipe, engine),
            release.without,
        ),
        venv_release("huggingface_hub", hub, {}, tool_dir(recipe, "huggingface_hub", hub)),
    ]


def topology_releases(recipe: Recipe, topology: str) -> list[VenvRelease]:
    """Every release the hosts of ``topology`` install, each once."""
    topo = recipe.topologies[topology]
    releases = engine_releases(recipe, topo.engine)
    if topo.router is not None:
        releases += router_releases(recipe, topology)
    return releases
