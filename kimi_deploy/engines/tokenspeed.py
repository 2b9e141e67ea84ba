"""The TokenSpeed engine unit: ``tokenspeed serve`` (gateway + engine on rank 0, engine elsewhere)."""

from __future__ import annotations

from dataclasses import replace

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
from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_paths import engine_dir, model_dir

UNIT = "kimi-tokenspeed"
MAX_PORT = 65535


def check_layout(recipe_file: str, placement: Placement) -> None:
    # Its gateway takes the key only as a command-line option, and argv is world-readable. This
    # also keeps its control server, which checks no key and binds the API's address, on loopback.
    loopback_only(recipe_file, placement, "TokenSpeed")
    where = f"topologies.{placement.topology_name}"
    p = placement.pool.parallel
    if (p.tp * p.dp) % p.ep:
        raise ConfigError(
            recipe_file,
            f"{where}.pools.{placement.pool_name}.parallel",
            f"TokenSpeed needs ep to divide tp*dp = {p.tp * p.dp}, found ep {p.ep}",
        )


def gateway_listen(recipe_file: str, placement: Placement, port: int) -> tuple[list[str], dict[str, int]]:
    """The flags for the two servers ``tokenspeed serve`` starts beside its API, and their ports,
    both on loopback: its smg gateway's Prometheus exporter at ``ports.router_metrics`` (the
    gateway is an smg router) and its control server at the API port + 1 (the release's own).

    Unless told, the exporter binds 0.0.0.0 on a port drawn at each start (tokenspeed 0.1.1
    tokenspeed/cli/serve_smg.py:301-331,703-705; tokenspeed-smg smg/router_args.py:1060-1077).
    The control server checks no key and binds ``--host``, which is loopback (``check_layout``),
    at ``--control-port`` (serve_smg.py:724-733). Only rank 0 runs either: the other ranks run
    the engine alone (serve_smg.py:858-879).
    """
    if placement.node_rank:
        return [], {}
    if port == MAX_PORT:
        where = f"topologies.{placement.topology_name}.ports.api"
        raise ConfigError(recipe_file, where, f"TokenSpeed's control server takes the API port + 1: {port} leaves none")
    metrics, control = placement.topology.ports.router_metrics, port + 1
    flags = ["--prometheus-host", LOOPBACK, "--prometheus-port", str(metrics), "--control-port", str(control)]
    return flags, {"gateway_metrics": metrics, "control": control}


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    check_layout(recipe_file, placement)
    p = placement.pool.parallel
    # TokenSpeed's gateway listens on 0.0.0.0 unless told otherwise: always say where.
    bind, port, listens = api_listen(placement, ENGINE)
    argv = [f"{engine_dir(recipe, 'tokenspeed')}/bin/tokenspeed", "serve"]
    argv += ["--model", model_dir(recipe), "--served-model-name", recipe.model.served_name]
    argv += ["--host", bind, "--port", str(port)]
    gateway, local = gateway_listen(recipe_file, placement, port)
    argv += gateway
    ep = ("--enable-expert-parallel", "--expert-parallel-size")
    argv += size_flags(p, tp="--tensor-parallel-size", dp="--data-parallel-size", pp="--pipeline-parallel-size", ep=ep)
    argv += dist_init_flags(placement, listens)
    argv += ["--max-model-len", str(placement.topology.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=False)
    unit = engine_unit_for(recipe, placement, name=UNIT, label="TokenSpeed", argv=argv, listens=listens, bind=bind)
    return replace(unit, local_listens=local)


ENGINE = Engine(name="tokenspeed", default_api_port=8000, unit=engine_unit)
