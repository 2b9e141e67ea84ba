"""What every engine's unit shares: its role in the instance, its name line, common flags."""

from __future__ import annotations

from collections.abc import Mapping

from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.listen import bind_address
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import ConfigFile, NodeRole, Unit
from kimi_deploy.recipe import Parallel, Recipe
from kimi_deploy.render.unit_env import common_env


def node_role(placement: Placement) -> NodeRole:
    if placement.node_rank:
        return "worker"
    return "leader" if placement.nodes > 1 else "single"


def loopback_only(recipe_file: str, placement: Placement, label: str, key_option: str = "") -> None:
    """What an engine that takes its API key only on its command line (``key_option``), and moves
    no KV cache between instances, refuses: ``expose`` (argv is readable by every local user, and
    kimi-deploy never puts a secret there) and ``kv_transfer``."""
    where = f"topologies.{placement.topology_name}"
    if placement.topology.expose is not None:
        said = f" ({key_option})" if key_option else ""
        raise ConfigError(
            recipe_file,
            f"{where}.expose",
            f"{label} takes its API key only on the command line{said}, which kimi-deploy never does "
            f"with a secret: serve {label} on loopback",
        )
    if placement.topology.kv_transfer is not None:
        raise ConfigError(recipe_file, f"{where}.kv_transfer", f"not supported with {label}")


def api_listen(placement: Placement, engine: Engine) -> tuple[str, int, dict[str, int]]:
    """Where an instance of ``engine`` serves its API (``bind_address``, ``Engine.api_port``) and
    what this host of it listens on for that: the API, on rank 0 only."""
    port = engine.api_port(placement.topology)
    return bind_address(placement.topology, placement.host), port, ({} if placement.node_rank else {"api": port})


def size_flags(parallel: Parallel, *, tp: str, dp: str, pp: str, ep: tuple[str, ...]) -> list[str]:
    """The pool's parallel sizes as the engine's flags: tensor parallel always, the others above 1
    (``ep``: the flags before the expert-parallel size)."""
    out = [tp, str(parallel.tp)]
    if parallel.dp > 1:
        out += [dp, str(parallel.dp)]
    if parallel.pp > 1:
        out += [pp, str(parallel.pp)]
    if parallel.ep > 1:
        out += [*ep, str(parallel.ep)]
    return out


def dist_init_flags(placement: Placement, listens: dict[str, int]) -> list[str]:
    """``--nnodes/--node-rank/--dist-init-addr`` (SGLang, TokenSpeed); the leader listens on it."""
    if placement.nodes == 1:
        return []
    port = placement.topology.ports.dist_init
    if placement.node_rank == 0:
        listens["dist_init"] = port
    return [
        "--nnodes",
        str(placement.nodes),
        "--node-rank",
        str(placement.node_rank),
        "--dist-init-addr",
        f"{placement.leader.address}:{port}",
    ]


def model_flags(recipe: Recipe, placement: Placement, tool_choice_flag: bool) -> list[str]:
    """Load format, remote code and parsers, spelled alike by every engine."""
    topo = placement.topology
    flags: list[str] = []
    if topo.load_format:
        flags += ["--load-format", topo.load_format]
    if recipe.model.trust_remote_code:
        flags += ["--trust-remote-code"]
    if topo.parsers.tool_call:
        flags += ["--tool-call-parser", topo.parsers.tool_call]
        if tool_choice_flag:
            flags += ["--enable-auto-tool-choice"]
    if topo.parsers.reasoning:
        flags += ["--reasoning-parser", topo.parsers.reasoning]
    return flags


def engine_unit_for(
    recipe: Recipe,
    placement: Placement,
    *,
    name: str,
    label: str,
    argv: list[str],
    listens: Mapping[str, int],
    bind: str,
    env: Mapping[str, str] | None = None,
    secret_env: tuple[str, ...] = (),
    secret_files: Mapping[str, str] | None = None,
    files: Mapping[str, ConfigFile] | None = None,
) -> Unit:
    role = node_role(placement)
    version = recipe.engines[placement.topology.engine].version
    return Unit(
        name=name,
        kind="engine",
        stage=2 if role == "worker" else 1,
        description=(
            f"Kimi {recipe.model.served_name} {label} {version} ({placement.topology_name} "
            f"{placement.pool_name} instance {placement.instance} {role} rank {placement.node_rank})"
        ),
        argv=tuple(argv),
        env=common_env(placement) if env is None else env,
        listens=listens,
        bind=bind,
        secret_env=secret_env,
        secret_files=secret_files or {},
        files=files or {},
    )


# vLLM's gauge of KV cache use (a fraction), and its name before vLLM 0.10 (vLLM's "Metrics"
# design doc: vllm:gpu_cache_usage_perc was renamed vllm:kv_cache_usage_perc); vLLM's TPU build
# serves the same /metrics
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
