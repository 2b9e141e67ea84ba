"""Where a release lives on a host: versioned, immutable folders named from the recipe's pins."""

from __future__ import annotations

from collections.abc import Mapping

from kimi_deploy.recipe import Checkpoint, EngineName, Recipe, RouterName, StoreName

# A unit's cache folder (its CacheDirectory=kimi/<unit>, under systemd's /var/cache: templates/_hardening.j2).
UNIT_CACHE_ROOT = "/var/cache/kimi"


def release_dir(base: str, package: str, version: str, packages: Mapping[str, str] | None = None) -> str:
    """``BASE/vllm-0.34.0+fastsafetensors-0.5.0``: every pin is in the name, so a release with
    other pins is another folder and an installed one is never changed."""
    extra = "".join(f"+{name}-{pin}" for name, pin in sorted((packages or {}).items()))
    return f"{base}/{package}-{version}{extra}"


def engine_dir(recipe: Recipe, engine: EngineName) -> str:
    """The virtual environment of the pinned engine release (with its pinned extra packages)."""
    release = recipe.engines[engine]
    return release_dir(recipe.paths.engines, release.distribution(engine), release.version, release.packages)


def router_dir(recipe: Recipe, package: RouterName) -> str:
    """The virtual environment of the pinned router release (with its pinned extra packages)."""
    release = recipe.routers[package]
    return release_dir(recipe.paths.engines, package, release.version, release.packages)


def store_dir(recipe: Recipe, package: StoreName) -> str:
    """The virtual environment of the pinned KV store release (the Mooncake master's)."""
    release = recipe.stores[package]
    return release_dir(recipe.paths.engines, package, release.version, release.packages)


def tool_dir(recipe: Recipe, package: str, version: str) -> str:
    """The virtual environment of a pinned host-side tool (huggingface_hub for weight syncs)."""
    return release_dir(recipe.paths.tools, package, version)


def checkpoint_dir(recipe: Recipe, checkpoint: Checkpoint) -> str:
    """A checkpoint's files at its pinned revision (the model's, a draft's)."""
    return f"{recipe.paths.models}/{checkpoint.dir_name}/{checkpoint.revision}"


def model_dir(recipe: Recipe) -> str:
    """The weights at the pinned revision."""
    return checkpoint_dir(recipe, recipe.model)


def unit_cache_dir(unit: str) -> str:
    """The cache folder systemd gives ``unit`` (its ``XDG_CACHE_HOME``)."""
    return f"{UNIT_CACHE_ROOT}/{unit}"
