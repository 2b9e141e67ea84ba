"""The serving engines kimi-deploy plans for, found by the name a recipe uses.

Each engine is one module of this package behind one interface (``interface.Engine``): its
unit's command line and what goes with it, its default API port, the packages its host needs.
"""

from __future__ import annotations

from collections.abc import Mapping

from kimi_deploy.engines import sglang, sglang_jax, tokenspeed, vllm, vllm_tpu
from kimi_deploy.engines.interface import Engine
from kimi_deploy.recipe import EngineName

ENGINES: Mapping[EngineName, Engine] = {
    e.name: e for e in (vllm.ENGINE, sglang.ENGINE, sglang_jax.ENGINE, vllm_tpu.ENGINE, tokenspeed.ENGINE)
}


def engine(name: EngineName) -> Engine:
    """The engine a recipe names (the recipe's schema admits only registered names)."""
    return ENGINES[name]
