"""An engine unit with the compile cache of its key: the planner's part of compile caches."""

from __future__ import annotations

import os
from dataclasses import replace

from kimi_deploy.compile_cache.key import CacheKey, artifact_dir, cache_key
from kimi_deploy.engines import engine
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import CompileCache, Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_paths import engine_dir


def unit_key(recipe: Recipe, placement: Placement, unit: Unit) -> CacheKey:
    """The key of the cache ``unit``'s engine compiles on ``placement``'s host: one per rank, or,
    for an engine whose ranks share one cache (``Engine.compile_cache_ranks``), one for every rank
    of the launch."""
    topology = placement.topology
    accelerators = topology.accelerators
    # every driver the recipe pins: a host of another kind's pin changing costs a compile, never a wrong cache
    driver = recipe.drivers.model_dump_json()
    return cache_key(
        engine=topology.engine,
        release=os.path.basename(engine_dir(recipe, topology.engine)),
        checkpoints={role: f"{c.repo}@{c.revision}" for role, c in recipe.checkpoints(placement.topology_name)},
        argv=unit.argv,
        env=unit.env,
        placement=placement,
        device=f"{accelerators.vendor}:{accelerators.model or '-'}x{accelerators.per_host}",
        driver=driver,
        ranks=engine(topology.engine).compile_cache_ranks,
    )


def with_compile_cache(recipe: Recipe, placement: Placement, unit: Unit) -> Unit:
    """``unit`` with the compile cache of its key, where its engine's launch compiles; as it is else."""
    target = engine(placement.topology.engine).compile_cache(unit)
    if target is None:
        return unit
    key = unit_key(recipe, placement, unit)
    return replace(unit, compile_cache=CompileCache(key.digest(), artifact_dir(unit.name, key), target))
