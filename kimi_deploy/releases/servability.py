"""Whether a topology's engine release can load its checkpoints at all.

A checkpoint's architecture (config.json ``architectures[0]``) is the recipe's ``architecture``
of it (``model.architecture``, a speculative draft's), which must agree with what its lock
recorded from the Hub, or, when the recipe names none, the lock's. Each topology's engine release
must register the architecture of every checkpoint the topology holds (the model, its draft): the
catalog's ``architectures`` (what ``tools/extract_flag_catalog.py`` read from the release's own
model registry in its wheel). A checkpoint with no known architecture (no field, no lock that
records one) is not checked. A refusal lifts by itself once the pinned release's catalog registers
the architecture. The model's tokenizer must load as the recipe says: a lock that recorded a
tokenizer of the checkpoint's own code needs ``model.trust_remote_code``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import Checkpoint, EngineName, Recipe
from kimi_deploy.releases.catalog import CatalogMissing, engine_catalog
from kimi_deploy.weights.lockfile import Lock, lock_path, read_lock

# How many registered names a refusal shows, the closest first.
SHOWN = 4
# The leading word of an architecture name: its model family (Kimi, Deepseek, Qwen3...).
_FAMILY = re.compile(r"^[A-Z][a-z]+")
# Families whose architectures share a lineage: Kimi K2 is DeepSeek V3's architecture (vLLM 0.34.0,
# vllm/transformers_utils/config.py: ``kimi_k2="DeepseekV3Config"``), which Kimi K3's MLA layers keep.
_RELATED = {"Kimi": ("Deepseek",)}


def _recorded(checkpoint: Checkpoint, base: Path | None) -> Lock | None:
    """``checkpoint``'s lock, None while it has none (``kimi-deploy lock`` not run yet)."""
    return read_lock(checkpoint, base) if lock_path(checkpoint, base).is_file() else None


def checkpoint_architecture(
    checkpoint: Checkpoint, field: str, recipe_file: str, base: Path | None = None, lock: Lock | None = None
) -> str | None:
    """The architecture the engines must register for ``checkpoint`` (the recipe's ``field``): the
    recipe's, checked against the lock's, or the lock's; None when neither names one. ``base``: the
    folder of ``recipes/locks`` (default: here); ``lock``: its lock, already read."""
    declared = checkpoint.architecture
    path = lock_path(checkpoint, base)
    lock = lock or _recorded(checkpoint, base)
    recorded = lock.architectures if lock is not None else ()
    if declared is not None and recorded and declared != recorded[0]:
        raise ConfigError(
            recipe_file,
            f"{field}.architecture",
            f"{declared} is not the checkpoint's: config.json at {checkpoint.revision} names "
            f"{', '.join(recorded)} ({path})",
        )
    return declared or (recorded[0] if recorded else None)


def model_architecture(recipe: Recipe, recipe_file: str, base: Path | None = None) -> str | None:
    """The model's architecture (``checkpoint_architecture``)."""
    return checkpoint_architecture(recipe.model, "model", recipe_file, base)


def check_remote_code(recipe: Recipe, recipe_file: str, base: Path | None = None, lock: Lock | None = None) -> None:
    """Refuse a model whose lock recorded a tokenizer of the checkpoint's own code while the recipe
    does not trust remote code: the engine would fail to load its tokenizer. ``lock``: the model's
    lock, already read."""
    model = recipe.model
    lock = lock or _recorded(model, base)
    if model.trust_remote_code or lock is None or not lock.tokenizer_remote_code:
        return
    raise ConfigError(
        recipe_file,
        "model.trust_remote_code",
        f"{model.repo}@{model.revision[:12]}'s tokenizer is code of its own (auto_map AutoTokenizer, "
        f"{lock_path(model, base)}): set trust_remote_code: true, the revision pinned, or serve another checkpoint",
    )


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


def _refusal(recipe: Recipe, recipe_file: str, topology: str, architecture: str, field: str) -> ConfigError | None:
    engine = recipe.topologies[topology].engine
    registered = _registered(recipe, engine)
    if registered is None or architecture in registered:
        return None
    near = closest(architecture, registered)
    shown = f"registers {', '.join(near)}" if near else f"registers {len(registered)} others, none like it"
    # the model's refusal names the topology, as ever; a draft's its own field
    where = f"topologies.{topology}" if field == "model" else field
    return ConfigError(
        recipe_file,
        where,
        f"{_release(recipe, engine)} does not register {architecture} ({shown}); {served_by(recipe, architecture)}",
    )


def refusals(
    recipe: Recipe, recipe_file: str, topologies: Sequence[str], base: Path | None = None
) -> dict[str, ConfigError]:
    """Each of ``topologies`` whose engine release does not register the architecture of one of
    its checkpoints (the model, then its draft), with its one line; each architecture read once
    (``ConfigError`` when recipe and lock disagree, or when the model's tokenizer needs remote code
    the recipe does not trust)."""
    model_lock = _recorded(recipe.model, base)
    check_remote_code(recipe, recipe_file, base, model_lock)
    known: dict[tuple[str, str], str | None] = {}
    out: dict[str, ConfigError] = {}
    for name in dict.fromkeys(topologies):
        for field, checkpoint in recipe.checkpoints(name):
            key = (checkpoint.repo, checkpoint.revision)
            if key not in known:
                lock = model_lock if checkpoint is recipe.model else None
                known[key] = checkpoint_architecture(checkpoint, field, recipe_file, base, lock)
            architecture = known[key]
            refused = _refusal(recipe, recipe_file, name, architecture, field) if architecture else None
            if refused is not None:
                out[name] = refused
                break
    return out


def check_servable(recipe: Recipe, recipe_file: str, topology: str, base: Path | None = None) -> None:
    """Refuse ``topology`` when its engine release does not register the architecture of one of its
    checkpoints, or the model's tokenizer needs remote code the recipe does not trust."""
    refused = refusals(recipe, recipe_file, [topology], base).get(topology)
    if refused is not None:
        raise refused
