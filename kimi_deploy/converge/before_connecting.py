"""What a converge refuses before it connects to any host, checked by ``kimi-deploy validate``.

The converge reads, on the controller, the lock of every checkpoint its engine hosts hold
(``kimi_deploy.weights.lockfile.read_lock``) and the API keys of every topology it serves beyond
loopback (``kimi_deploy.secrets.read_secret``: the recipe's ``expose.api_key`` and a router's
hosted fallback key). Each one missing, unreadable or not the recipe's stops it; the same
functions say so here, one line each, before the run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import Recipe, SecretRef
from kimi_deploy.secrets import read_secret
from kimi_deploy.weights.lockfile import read_lock


def _keys(recipe: Recipe, topology: str) -> list[tuple[str, SecretRef]]:
    """The keys the controller reads for ``topology``, each with its recipe field."""
    topo = recipe.topologies[topology]
    keys: list[tuple[str, SecretRef]] = []
    if topo.expose is not None:
        keys.append((f"topologies.{topology}.expose.api_key", topo.expose.api_key))
        if topo.router is not None and topo.router.fallback is not None:
            keys.append((f"topologies.{topology}.router.fallback.api_key", topo.router.fallback.api_key))
    return keys


def refusals(recipe: Recipe, recipe_file: str, topologies: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """One line per lock or key of ``topologies`` (those the inventory places) that the converge
    would refuse; empty when there is none. Locks are read from the working directory, as the
    converge reads them."""
    names = list(topologies)
    lines: list[str] = []
    seen: set[tuple[str, str]] = set()
    for name in names:
        for _, checkpoint in recipe.checkpoints(name):
            if (checkpoint.repo, checkpoint.revision) in seen:
                continue
            seen.add((checkpoint.repo, checkpoint.revision))
            try:
                read_lock(checkpoint)
            except ConfigError as exc:
                lines.append(str(exc).replace("RECIPE", recipe_file))
    for name in names:
        for field, ref in _keys(recipe, name):
            try:
                read_secret(ref, recipe_file, field, environ)
            except ConfigError as exc:
                lines.append(str(exc))
    return list(dict.fromkeys(lines))
