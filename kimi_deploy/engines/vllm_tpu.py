"""vLLM on TPUs: its TPU build (PyPI ``vllm-tpu``, import name ``vllm``), ``vllm serve MODEL``.

vLLM's TPU build is vLLM's front end and scheduler over tpu-inference (PyPI ``tpu-inference``, a
``vllm.general_plugins`` entry point that the wheel pins ``==`` its own version): its platform
(``vllm/platforms/__init__.py`` ``tpu_platform_plugin``: ``tpu_inference.platforms.tpu_platform.TpuPlatform``),
workers and model code run on JAX. What this module emits, from the 0.32.0 wheels
(``vllm_tpu-0.32.0-cp312-cp312-manylinux_2_24_x86_64.whl`` and ``tpu_inference-0.32.0-py3-none-any.whl``,
the catalog's sources):
- What loads on a TPU is tpu-inference's: ``tpu_inference/models/common/model_loader.py``
  ``get_model`` tries its JAX-native ``_MODEL_REGISTRY`` and falls back to vLLM's own PyTorch model
  run through torchax (``get_vllm_model``), which vLLM's registry resolves as the TPU platform
  loads it: Kimi K2.5/K2.6 (``KimiK25ForConditionalGeneration``, one of its
  ``_VLLM_PREFERRED_ARCHITECTURES``) loads, Kimi K3 does not (``vllm/models/kimi_k3/__init__.py``
  binds no class on a TPU). The catalog's ``architectures`` is that union (``tools/flag_catalog``).
- ``--tensor-parallel-size`` counts JAX devices: tpu-inference's mesh takes
  ``tensor_parallel_size`` devices per data-parallel rank (``tpu_inference/layers/common/sharding.py``
  ``ShardingConfigManager.from_vllm_config``, ``total_devices``), so the recipe's accelerators
  times the devices on each (``AcceleratorKind.devices_per_accelerator``: two per TPU7x chip), as the
  TPU7x recipes run it (``--tensor-parallel-size=8`` on one 4-chip tpu7x host:
  AI-Hypercomputer/tpu-recipes inference/ironwood/vLLM/Qwen3.5-397B/qwen3_5-server.yaml).
  ``--data-parallel-size`` the data-parallel ranks; a pipeline runs on one host only
  (``tpu_platform.py``: ``MultiprocExecutor``) and is not emitted.
- ``--enable-expert-parallel``: tpu-inference copies vLLM's ``enable_expert_parallel`` into each
  MoE layer (``tpu_inference/layers/vllm/quantization/configs.py``), which then takes its
  expert-parallel kernel (``tpu_inference/layers/vllm/interface/moe.py``: GMM_EP). The sharding's
  ``expert_parallelism`` of ``--additional-config`` is another mesh axis, multiplied into the devices
  an instance takes (``sharding.py``), so it is not emitted: experts spread over the instance's
  devices as vLLM's rule on GPUs has it (ep is 1 or tp*dp).
- One host per instance: with no ``TPU_MULTIHOST_BACKEND`` the platform runs the one-process
  executor (``tpu_platform.py`` ``check_and_update_config``); across hosts tpu-inference runs on a
  Ray cluster (``TPU_MULTIHOST_BACKEND=ray``, ``tpu_inference/executors/ray_distributed_executor.py``;
  its docs/multi-host.md starts that cluster with scripts/multihost/run_cluster.sh), which
  kimi-deploy does not run: an instance over several hosts is refused.
- ``JAX_PLATFORMS=tpu``: tpu-inference reads it (``tpu_inference/envs.py``: "", tpu, cpu, proxy),
  and JAX then fails on a host without its TPU rather than serve on CPU. ``VLLM_XLA_CACHE_PATH``
  keeps XLA's compiled programs in the unit's cache folder across restarts: tpu-inference points
  JAX's compilation cache at it (``tpu_inference/runner/compilation_manager.py``, unless
  ``VLLM_DISABLE_COMPILE_CACHE``).
- Its API key is vLLM's: ``VLLM_API_KEY`` from the environment when ``--api-key`` is not given
  (``vllm/envs.py``, ``vllm/entrypoints/serve/middleware/register.py``), through the unit's secret
  env file, as ``engines/vllm.py`` does.
- Its parsers are vLLM's (``kimi_k2`` for Kimi K2.x); quantized MoE experts load through
  tpu-inference's methods (``tpu_inference/layers/vllm/quantization``: compressed-tensors 4-bit
  experts, the K2.x checkpoints' INT4, run as W4A8; ``mxfp4``, ``fp8``); the platform lists them
  (``tpu_platform.py`` ``supported_quantization``).
"""

from __future__ import annotations

from kimi_deploy.accelerators import accelerator
from kimi_deploy.engines.common import VLLM_KV_USAGE, engine_unit_for, model_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.listen import bind_address
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import EngineName, Recipe
from kimi_deploy.releases.catalog import Catalog, engine_catalog
from kimi_deploy.releases.host_paths import engine_dir, model_dir, unit_cache_dir
from kimi_deploy.render.unit_env import common_env

NAME: EngineName = "vllm-tpu"
UNIT = "kimi-vllm-tpu"
# the folder tpu-inference gives JAX as its persistent compilation cache
CACHE_ENV = "VLLM_XLA_CACHE_PATH"


def devices(placement: Placement) -> int:
    """The JAX devices of one data-parallel rank: its accelerators times the devices on each."""
    p, acc = placement.pool.parallel, placement.topology.accelerators
    return p.tp * accelerator(acc.vendor).devices_per_accelerator(acc.model)


def check_layout(recipe_file: str, placement: Placement) -> None:
    """What vllm-tpu 0.32.0 cannot serve, each refused in one line naming the recipe field."""
    pool = placement.pool
    p = pool.parallel
    where = f"topologies.{placement.topology_name}"
    field = f"{where}.pools.{placement.pool_name}"
    if placement.topology.kv_transfer is not None:
        raise ConfigError(recipe_file, f"{where}.kv_transfer", f"not supported with {NAME}")
    hosts = pool.hosts // pool.instances
    if hosts > 1:
        raise ConfigError(
            recipe_file,
            f"{field}.hosts",
            f"{NAME} spans hosts only on a Ray cluster (TPU_MULTIHOST_BACKEND=ray), which kimi-deploy "
            f"does not run: expected 1 host per instance, found {hosts}",
        )
    if p.pp > 1:
        raise ConfigError(recipe_file, f"{field}.parallel", f"{NAME} pipeline parallel is not planned, found pp {p.pp}")
    if p.ep not in (1, p.tp * p.dp):
        raise ConfigError(
            recipe_file,
            f"{field}.parallel",
            f"{NAME} expert parallel spans tp*dp = {p.tp * p.dp} chips, found ep {p.ep}",
        )


def launch_argv(recipe: Recipe) -> list[str]:
    """``vllm serve MODEL``, the release's console script."""
    launch = engine_catalog(recipe, NAME).launch
    return [f"{engine_dir(recipe, NAME)}/bin/{launch[0]}", *launch[1:], model_dir(recipe)]


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    check_layout(recipe_file, placement)
    topo = placement.topology
    p = placement.pool.parallel
    bind = bind_address(topo, placement.host)
    port = ENGINE.api_port(topo)
    argv = launch_argv(recipe)
    argv += ["--served-model-name", recipe.model.served_name, "--host", bind, "--port", str(port)]
    argv += ["--tensor-parallel-size", str(devices(placement))]
    if p.dp > 1:
        argv += ["--data-parallel-size", str(p.dp)]
    if p.ep > 1:
        argv += ["--enable-expert-parallel"]
    argv += ["--max-model-len", str(topo.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=True)
    env = {"JAX_PLATFORMS": "tpu", CACHE_ENV: f"{unit_cache_dir(UNIT)}/xla", **common_env(placement)}
    # vLLM reads its API key from this variable; it reaches the unit through its secret env file.
    secret_env = ("VLLM_API_KEY",) if topo.expose is not None else ()
    return engine_unit_for(
        recipe,
        placement,
        name=UNIT,
        label="vLLM TPU",
        argv=argv,
        listens={"api": port},
        bind=bind,
        env=env,
        secret_env=secret_env,
    )


def positionals(catalog: Catalog) -> int:
    """Arguments before the first flag: ``vllm serve`` and the model path."""
    return len(catalog.launch) + 1


def compile_cache(unit: Unit) -> str | None:
    """The folder JAX keeps the XLA programs the engine compiles in: the unit's
    ``VLLM_XLA_CACHE_PATH``, which tpu-inference makes JAX's persistent compilation cache
    (``tpu_inference/runner/compilation_manager.py:88-91``). JAX reads an entry by its own key (the
    program, the jaxlib version, XLA's flags, the devices and their topology; docs.jax.dev,
    persistent_compilation_cache "How it works"); an instance here is one host (``check_layout``).
    It is JAX's cache, which every process of a job reads and the process of rank 0 alone writes
    (docs.jax.dev, persistent_compilation_cache "Multiple process and multiple devices"): its ranks
    share one cache (``compile_cache_ranks``)."""
    return unit.env.get(CACHE_ENV)


ENGINE = Engine(
    name=NAME,
    default_api_port=8000,
    unit=engine_unit,
    positionals=positionals,
    kv_usage_metrics=VLLM_KV_USAGE,
    compile_cache=compile_cache,
    compile_cache_ranks="shared",
)
