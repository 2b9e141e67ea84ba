"""The SGLang engine unit: ``sglang serve`` across ``--nnodes``, with HiCache and PD disaggregation."""

from __future__ import annotations

from kimi_deploy.engines.common import dist_init_flags, engine_unit_for, model_flags, size_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.listen import bind_address
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_paths import engine_dir, model_dir
from kimi_deploy.render.credentials import credential

UNIT = "kimi-sglang"
# SGLang reads its API key only from its options; a --config YAML file carries it, so the key never
# appears in argv. The file is root's alone; systemd hands SGLang a copy as a credential, which
# the engine user cannot change.
SECRET_CONFIG = "kimi-sglang.yaml"  # noqa: S105 - a file name


def check_layout(recipe_file: str, placement: Placement) -> None:
    p = placement.pool.parallel
    field = f"topologies.{placement.topology_name}.pools.{placement.pool_name}.parallel"
    if p.tp % p.ep:
        raise ConfigError(recipe_file, field, f"SGLang needs ep to divide tp, found tp {p.tp} ep {p.ep}")


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    topo = placement.topology
    secrets_dir = f"{recipe.paths.config}/secrets"
    p = placement.pool.parallel
    check_layout(recipe_file, placement)
    worker = placement.node_rank > 0
    bind = bind_address(topo, placement.host)
    port = ENGINE.api_port(topo)
    argv = [f"{engine_dir(recipe, 'sglang')}/bin/sglang", "serve"]
    argv += ["--model-path", model_dir(recipe), "--served-model-name", recipe.model.served_name]
    argv += ["--host", bind, "--port", str(port)]
    argv += size_flags(p, tp="--tp-size", dp="--dp-size", pp="--pp-size", ep=("--ep-size",))
    listens: dict[str, int] = {} if worker else {"api": port}
    argv += dist_init_flags(placement, listens)
    argv += ["--context-length", str(topo.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=False)
    if topo.hicache is not None:
        argv += ["--enable-hierarchical-cache", "--hicache-ratio", f"{topo.hicache.ratio:g}"]
        argv += ["--hicache-write-policy", topo.hicache.write_policy]
    if topo.kv_transfer is not None and placement.pool.role in ("prefill", "decode"):
        backend = "nixl" if "NixlConnector" in topo.kv_transfer.connectors else "mooncake"
        argv += ["--disaggregation-mode", placement.pool.role]
        argv += ["--disaggregation-transfer-backend", backend]
        argv += ["--disaggregation-bootstrap-port", str(topo.ports.bootstrap)]
        devices = placement.host.vars.kimi_rdma_devices
        if topo.kv_transfer.transport == "rdma" and devices:
            argv += ["--disaggregation-ib-device", ",".join(devices)]
        if placement.pool.role == "prefill" and not worker:
            listens["bootstrap"] = topo.ports.bootstrap
    secret_files: dict[str, str] = {}
    if topo.expose is not None and not worker:
        argv += ["--config", credential(SECRET_CONFIG)]
        secret_files[f"{secrets_dir}/{SECRET_CONFIG}"] = "sglang-secrets.yaml.j2"
    return engine_unit_for(
        recipe,
        placement,
        name=UNIT,
        label="SGLang",
        argv=argv,
        listens=listens,
        bind=bind,
        secret_files=secret_files,
    )


# its --config YAML names the key as the option it sets (--api-key)
ENGINE = Engine(
    name="sglang",
    default_api_port=30000,
    unit=engine_unit,
    secret_file_key="api-key",  # noqa: S106 - the key's name in its config file
    hicache_refusal=None,
    # SGLang's share of its token pool in use (docs/references/production_metrics.md)
    kv_usage_metrics=("sglang:token_usage",),
)
