"""The TokenSpeed engine unit: ``tokenspeed serve`` (gateway + engine on rank 0, engine elsewhere)."""

from __future__ import annotations

from kimi_deploy.engines.common import (
    api_listen,
    dist_init_flags,
    engine_unit_for,
    loopback_only,
    model_flags,
    size_flags,
)
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.host_paths import engine_dir, model_dir
from kimi_deploy.placement import Placement
from kimi_deploy.recipe import Recipe
from kimi_deploy.servespec import Unit

UNIT = "kimi-tokenspeed"


def check_layout(recipe_file: str, placement: Placement) -> None:
    # Its gateway takes the key only as a command-line option, and argv is world-readable.
    loopback_only(recipe_file, placement, "TokenSpeed")
    where = f"topologies.{placement.topology_name}"
    p = placement.pool.parallel
    if (p.tp * p.dp) % p.ep:
        raise ConfigError(
            recipe_file,
            f"{where}.pools.{placement.pool_name}.parallel",
            f"TokenSpeed needs ep to divide tp*dp = {p.tp * p.dp}, found ep {p.ep}",
        )


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    check_layout(recipe_file, placement)
    p = placement.pool.parallel
    # TokenSpeed's gateway listens on 0.0.0.0 unless told otherwise: always say where.
    bind, port, listens = api_listen(placement, ENGINE)
    argv = [f"{engine_dir(recipe, 'tokenspeed')}/bin/tokenspeed", "serve"]
    argv += ["--model", model_dir(recipe), "--served-model-name", recipe.model.served_name]
    argv += ["--host", bind, "--port", str(port)]
    ep = ("--enable-expert-parallel", "--expert-parallel-size")
    argv += size_flags(p, tp="--tensor-parallel-size", dp="--data-parallel-size", pp="--pipeline-parallel-size", ep=ep)
    argv += dist_init_flags(placement, listens)
    argv += ["--max-model-len", str(placement.topology.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=False)
    return engine_unit_for(recipe, placement, name=UNIT, label="TokenSpeed", argv=argv, listens=listens, bind=bind)


ENGINE = Engine(name="tokenspeed", default_api_port=8000, unit=engine_unit)
