"""The TokenSpeed engine unit: ``tokenspeed serve`` (gateway + engine on rank 0, engine elsewhere)."""

from __future__ import annotations

from kimi_deploy.engines.common import dist_init_flags, engine_unit_for, model_flags, size_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.host_paths import engine_dir, model_dir
from kimi_deploy.listen import bind_address
from kimi_deploy.placement import Placement
from kimi_deploy.recipe import Recipe
from kimi_deploy.servespec import Unit

UNIT = "kimi-tokenspeed"


def check_layout(recipe_file: str, placement: Placement) -> None:
    topo = placement.topology
    where = f"topologies.{placement.topology_name}"
    if topo.expose is not None:
        # Its gateway takes the key only as a command-line option, and argv is world-readable.
        raise ConfigError(
            recipe_file,
            f"{where}.expose",
            "TokenSpeed takes its API key only on the command line, which kimi-deploy never "
            "does with a secret: serve TokenSpeed on loopback",
        )
    if topo.kv_transfer is not None:
        raise ConfigError(recipe_file, f"{where}.kv_transfer", "not supported with TokenSpeed")
    p = placement.pool.parallel
    if (p.tp * p.dp) % p.ep:
        raise ConfigError(
            recipe_file,
            f"{where}.pools.{placement.pool_name}.parallel",
            f"TokenSpeed needs ep to divide tp*dp = {p.tp * p.dp}, found ep {p.ep}",
        )


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    topo = placement.topology
    p = placement.pool.parallel
    check_layout(recipe_file, placement)
    # TokenSpeed's gateway listens on 0.0.0.0 unless told otherwise: always say where.
    bind = bind_address(topo, placement.host)
    port = ENGINE.api_port(topo)
    argv = [f"{engine_dir(recipe, 'tokenspeed')}/bin/tokenspeed", "serve"]
    argv += ["--model", model_dir(recipe), "--served-model-name", recipe.model.served_name]
    argv += ["--host", bind, "--port", str(port)]
    ep = ("--enable-expert-parallel", "--expert-parallel-size")
    argv += size_flags(p, tp="--tensor-parallel-size", dp="--data-parallel-size", pp="--pipeline-parallel-size", ep=ep)
    listens: dict[str, int] = {} if placement.node_rank else {"api": port}
    argv += dist_init_flags(placement, listens)
    argv += ["--max-model-len", str(topo.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=False)
    return engine_unit_for(recipe, placement, name=UNIT, label="TokenSpeed", argv=argv, listens=listens, bind=bind)


ENGINE = Engine(name="tokenspeed", default_api_port=8000, unit=engine_unit)
