"""SGLang on TPUs: its JAX backend (PyPI ``sglang-jax``), ``python -m sgl_jax.launch_server``.

Mainline SGLang has no TPU device; SGLang serves TPUs through this separate engine, with its own
launcher and flags (https://docs.sglang.io/platforms/tpu.html). What this module emits, from the
0.1.0rc0 wheel (``sgl_jax/``, the release its catalog was read from):
- ``--tp-size`` counts JAX devices over every node: the scheduler lays ``jax.devices()`` out as a
  ``[dp, tp / dp]`` mesh (``srt/managers/scheduler.py``), so the recipe's accelerators count
  times the devices on each (``AcceleratorKind.devices_per_accelerator``: two per TPU7x chip);
  ``--dp-size`` the data-parallel ranks inside it; it has no pipeline parallelism.
- ``--ep-size`` is honoured by the ``epmoe`` MoE backend alone (the fused backends take the whole
  mesh and only log a warning: ``srt/managers/scheduler.py``, ``srt/layers/moe.py``), so it goes
  with ``--moe-backend epmoe``, and must divide the devices.
- A model with linear-recurrent (KDA) layers, as Kimi's are, needs the radix cache off or the
  unified tree (``srt/model_executor/model_runner_kv_cache_mixin.py``,
  ``_enforce_recurrent_state_server_constraints``): ``--disable-radix-cache``, with the page size
  of the engine's own Kimi-Linear recipe (``--page-size 128``: its MLA layers need 2 or more;
  docs/cookbook/autoregressive/Moonshotai/Kimi-Linear.md, docs/cookbook/base/tpu-topology-reference.md).
  The same check refuses host-memory offload (``--hicache-storage``) for such models: the recipe
  rules refuse ``hicache`` on this engine.
- ``--device tpu`` with ``JAX_PLATFORMS=tpu``: the engine asserts the two agree
  (``srt/server_args.py``), and JAX then fails on a host without its TPU rather than serve on CPU.
  ``JAX_COMPILATION_CACHE_DIR`` keeps XLA's compiled programs in the unit's cache folder across
  restarts, as the engine's multi-host deployment template does (docs/deployment/gke-indexed-job.md).
- Its API key is only ``--api-key`` (``srt/server_args.py``), on the command line that every
  local user can read: the engine is served on loopback only, like TokenSpeed.
- It answers what the deploy's smoke test asks of every engine: ``/health``, ``/v1/models`` and
  ``/v1/chat/completions`` (``srt/entrypoints/http_server.py``), on its rank 0 only.
- Its parsers are its own (tool calls: qwen25, qwen3_coder, mimo, glm47, glm45; reasoning:
  deepseek-r1, qwen3, mimo, kimi, glm45, gemma4): the planner holds a recipe's to the catalog.
"""

from __future__ import annotations

from kimi_deploy.accelerators import accelerator
from kimi_deploy.engines.common import api_listen, dist_init_flags, engine_unit_for, loopback_only, model_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.catalog import engine_catalog
from kimi_deploy.releases.host_paths import engine_dir, model_dir, unit_cache_dir
from kimi_deploy.render.unit_env import common_env

UNIT = "kimi-sglang-jax"
# JAX's persistent compilation cache: https://docs.jax.dev/en/latest/persistent_compilation_cache.html
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
# The page size of the engine's Kimi-Linear recipe (MLA layers need 2 or more).
PAGE_SIZE = 128


def devices(placement: Placement) -> int:
    """The JAX devices of one instance: its accelerators times the devices on each."""
    acc = placement.topology.accelerators
    return placement.pool.parallel.size * accelerator(acc.vendor).devices_per_accelerator(acc.model)


def check_layout(recipe_file: str, placement: Placement) -> None:
    loopback_only(recipe_file, placement, "sglang-jax", "--api-key")
    topo = placement.topology
    p = placement.pool.parallel
    field = f"topologies.{placement.topology_name}.pools.{placement.pool_name}.parallel"
    if p.pp > 1:
        raise ConfigError(recipe_file, field, f"sglang-jax has no pipeline parallelism, found pp {p.pp}")
    n = devices(placement)
    if n % p.ep:
        raise ConfigError(
            recipe_file,
            field,
            f"sglang-jax needs ep to divide the instance's {n} devices "
            f"({p.size} x {topo.accelerators.model} at {n // p.size} each), found ep {p.ep}",
        )


def engine_unit(recipe: Recipe, recipe_file: str, placement: Placement) -> Unit:
    check_layout(recipe_file, placement)
    p = placement.pool.parallel
    bind, port, listens = api_listen(placement, ENGINE)
    launch = engine_catalog(recipe, "sglang-jax").launch  # python -m sgl_jax.launch_server
    argv = [f"{engine_dir(recipe, 'sglang-jax')}/bin/{launch[0]}", *launch[1:]]
    argv += ["--model-path", model_dir(recipe), "--served-model-name", recipe.model.served_name]
    argv += ["--host", bind, "--port", str(port), "--device", "tpu", "--tp-size", str(devices(placement))]
    if p.dp > 1:
        argv += ["--dp-size", str(p.dp)]
    if p.ep > 1:
        argv += ["--ep-size", str(p.ep), "--moe-backend", "epmoe"]
    argv += dist_init_flags(placement, listens)
    argv += ["--context-length", str(placement.topology.max_model_len)]
    argv += model_flags(recipe, placement, tool_choice_flag=False)
    argv += ["--disable-radix-cache", "--page-size", str(PAGE_SIZE)]
    env = {"JAX_PLATFORMS": "tpu", CACHE_ENV: f"{unit_cache_dir(UNIT)}/jax", **common_env(placement)}
    return engine_unit_for(
        recipe, placement, name=UNIT, label="sglang-jax", argv=argv, listens=listens, bind=bind, env=env
    )


def compile_cache(unit: Unit) -> str | None:
    """The folder JAX keeps the XLA programs the engine compiles in, the unit's
    ``JAX_COMPILATION_CACHE_DIR``. JAX reads an entry by its own key (the program, the jaxlib
    version, XLA's flags, the devices and their topology), the same in every process of the job.
    Every process reads the cache, and only the process of rank 0 writes it (docs.jax.dev,
    persistent_compilation_cache "Multiple process and multiple devices"; jax 0.10.2
    ``jax/_src/compiler.py:429`` reads, ``:796-805`` writes from ``process_id`` 0 alone), which is
    the engine's node rank 0 (``sgl_jax/srt/managers/scheduler.py:358``:
    ``jax.distributed.initialize(dist_init_addr, nnodes, node_rank)``). So the ranks share one
    cache (``compile_cache_ranks``): node rank 0's folder is packed, and every other host of the
    launch starts from a copy of it."""
    return unit.env.get(CACHE_ENV)


ENGINE = Engine(
    name="sglang-jax",
    default_api_port=30000,
    unit=engine_unit,
    # sgl_jax/srt/model_executor/model_runner_kv_cache_mixin.py (sglang-jax 0.1.0rc0)
    hicache_refusal=(
        "hicache: sglang-jax refuses host-memory offload (--hicache-storage) for a model with "
        "linear-attention (KDA) layers such as Kimi's: its recurrent state stays on the TPU"
    ),
    compile_cache=compile_cache,
    compile_cache_ranks="shared",
)
