"""Whether a topology's engine release can load the model at all.

The checkpoint's architecture (config.json ``architectures[0]``) is the recipe's
``model.architecture``, which must agree with what the weights' lock recorded from the Hub, or,
when the recipe names none, the lock's. Each topology's engine release must register it: the
catalog's ``architectures`` (what ``tools/extract_flag_catalog.py`` read from the release's own
model registry in its wheel). A recipe whose model has no known architecture (no field, no lock
that records one) is not checked. A refusal lifts by itself once the pinned release's catalog
registers the architecture.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from kimi_deploy.catalog import CatalogMissing, engine_catalog
from kimi_deploy.errors import ConfigError
from kimi_deploy.lockfile import lock_path, read_lock
from kimi_deploy.recipe import EngineName, Recipe

# How many registered names a refusal shows, the closest first.
SHOWN = 4
# The leading word of an architecture name: its model family (Kimi, Deepseek, Qwen3...).
_FAMILY = re.compile(r"^[A-Z][a-z]+")
# Families whose architectures share a lineage: Kimi K2 is DeepSeek V3's architecture (vLLM 0.34.0,
# vllm/transformers_utils/config.py: ``kimi_k2="DeepseekV3Config"``), which Kimi K3's MLA layers keep.
_RELATED = {"Kimi": ("Deepseek",)}


def model_architecture(recipe: Recipe, recipe_file: str, base: Path | None = None) -> str | None:
    """The architecture the engines must register: the recipe's, checked against the lock's, or the
    lock's; None when neither names one. ``base``: the folder of ``recipes/locks`` (default: here)."""
    declared = recipe.model.architecture
    path = lock_path(recipe, base)
    recorded = read_lock(recipe, base).architectures if path.is_file() else ()
    if declared is not None and recorded and declared != recorded[0]:
        raise ConfigError(
            recipe_file,
            "model.architecture",
            f"{declared} is not the checkpoint's: config.json at {recipe.model.revision} names "
            f"{', '.join(recorded)} ({path})",
        )
    return declared or (recorded[0] if recorded else None)


def _registered(recipe: Recipe, engine: EngineName) -> tuple[str, ...] | None:
    """What the pinned release of ``engine`` registers; None when its catalog does not say."""
    try:
        return engine_catalog(recipe, engine).registries.get("architectures")
    except CatalogMissing:
        return None


def _release(recipe: Recipe, engine: EngineName) -> str:
    release = recipe.engines[engine]
    return f"{release.distribution(engine)} {release.version}"


def _family(name: str) -> str:
    match = _FAMILY.match(name)
    return match[0] if match else name


def _stem(name: str) -> str:
    """The model part of an architecture name: ``KimiK3`` of ``KimiK3ForConditionalGeneration``."""
    return re.split(r"For(?=[A-Z])", name, maxsplit=1)[0]


def _alike(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def closest(architecture: str, registered: tuple[str, ...]) -> list[str]:
    """A handful of ``registered`` nearest ``architecture``: its family's, then related families',
    the most alike model part first; else the names most alike, if any."""
    kin = (_family(architecture), *_RELATED.get(_family(architecture), ()))

    def rank(name: str) -> tuple[int, float, float, str]:
        stems = _alike(_stem(architecture), _stem(name))
        return (kin.index(_family(name)), -stems, -_alike(architecture, name), name)

    family = [name for name in registered if _family(name) in kin]
    if family:
        return sorted(family, key=rank)[:SHOWN]
    return difflib.get_close_matches(architecture, registered, n=SHOWN, cutoff=0.6)


def served_by(recipe: Recipe, architecture: str) -> str:
    """Which topologies' engine releases of ``recipe`` register ``architecture``, per accelerator vendor."""
    vendors: dict[str, list[str]] = {}
    for topo in recipe.topologies.values():
        if architecture in (_registered(recipe, topo.engine) or ()):
            releases = vendors.setdefault(topo.accelerators.vendor, [])
            if _release(recipe, topo.engine) not in releases:
                releases.append(_release(recipe, topo.engine))
    if not vendors:
        return "no topology of the recipe serves it"
    return "served " + "; ".join(f"on {vendor} by {', '.join(names)}" for vendor, names in vendors.items())


def _refusal(recipe: Recipe, recipe_file: str, topology: str, architecture: str) -> ConfigError | None:
    engine = recipe.topologies[topology].engine
    registered = _registered(recipe, engine)
    if registered is None or architecture in registered:
        return None
    near = closest(architecture, registered)
    shown = f"registers {', '.join(near)}" if near else f"registers {len(registered)} others, none like it"
    return ConfigError(
        recipe_file,
        f"topologies.{topology}",
        f"{_release(recipe, engine)} does not register {architecture} ({shown}); {served_by(recipe, architecture)}",
    )


def refusals(
    recipe: Recipe, recipe_file: str, topologies: Sequence[str], base: Path | None = None
) -> dict[str, ConfigError]:
    """Each of ``topologies`` whose engine release does not register the model's architecture,
    with its one line; the architecture read once (``ConfigError`` when recipe and lock disagree)."""
    architecture = model_architecture(recipe, recipe_file, base)
    if architecture is None:
        return {}
    found = {name: _refusal(recipe, recipe_file, name, architecture) for name in dict.fromkeys(topologies)}
    return {name: refused for name, refused in found.items() if refused is not None}


def check_servable(recipe: Recipe, recipe_file: str, topology: str, base: Path | None = None) -> None:
    """Refuse ``topology`` when its engine release does not register the model's architecture."""
    refused = refusals(recipe, recipe_file, [topology], base).get(topology)
    if refused is not None:
        raise refused
