"""What the cluster's fake Hub serves: ``localcluster.tiny_model``'s Kimi-shaped repo, ``localcluster.tiny_llama``'s
repo that real engines run and its needle-detecting variant ``localcluster.needle_llama``, under one root (one
object store).

``build(root)`` is the ``hub`` service's prepare hook; each repo is a no-op when already built.
"""

from __future__ import annotations

from pathlib import Path

from localcluster import needle_llama, tiny_llama, tiny_model
from localcluster.hub_repo import RepoInfo


def build(root: Path) -> list[RepoInfo]:
    """Write every repo under ``root``; return their ids and file digests: Kimi's, the tiny Llama's, the needle's."""
    return [tiny_model.build(root), tiny_llama.build(root), needle_llama.build(root)]
