"""Where a release lives on a host: versioned, immutable folders named from the recipe's pins."""

from __future__ import annotations

from kimi_deploy.recipe import Recipe


def engine_dir(recipe: Recipe, package: str, version: str) -> str:
    """The virtual environment of one engine (or router) release, never changed once installed."""
    return f"{recipe.paths.engines}/{package}-{version}"


def tool_dir(recipe: Recipe, package: str, version: str) -> str:
    """The virtual environment of a pinned host-side tool (huggingface_hub for weight syncs)."""
    return f"{recipe.paths.tools}/{package}-{version}"


def model_dir(recipe: Recipe) -> str:
    """The weights at the pinned revision."""
    return f"{recipe.paths.models}/{recipe.model.dir_name}/{recipe.model.revision}"
