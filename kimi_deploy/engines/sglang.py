"""The SGLang engine unit: ``sglang serve`` across ``--nnodes``, with HiCache and PD disaggregation.

What it compiles at start is kept in one folder under the unit's cache folder, the engine's own
``SGLANG_CACHE_DIR`` (sglang 0.5.23, default ``~/.cache/sglang``: ``sglang/srt/environ.py:1383``),
which is its compile cache (``kimi_deploy.compile_cache``). Paths are of the published wheel
``sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl`` and of the releases it pins
(``sgl-deep-gemm==0.2.3.post2``, ``flashinfer_python==0.7.2``):

- ``deep_gemm/``: DeepGEMM's JIT cache. SGLang's ``SGLANG_DG_CACHE_DIR`` defaults to it
  (``srt/environ.py:1373``, ``:31-37``) and is handed to DeepGEMM as ``DG_JIT_CACHE_DIR``
  (``srt/layers/deep_gemm_wrapper/compile_utils.py:51``), with its compile locks in ``locks/``
  (``:138-140``). DeepGEMM keeps a kernel at ``cache/<name>.<digest>/`` (``kernel.cu``,
  ``kernel.cubin``, ``meta.json``, and the ``.committed`` mark it publishes it with) and builds in
  ``tmp/<uuid>`` (``deep_gemm/include/deep_jit/cache/disk.hpp:18,76-133``,
  ``deep_jit/backend/cuda/backend.hpp:85-167``).
- Triton's (``triton/``), inductor's (``inductor/``), the CUDA driver's (``nv/``), TileLang's
  (``tilelang/``) and FlashInfer's caches: SGLang points each there unless the environment already
  names one, first thing at import (``sglang/__init__.py:10-14``, ``srt/environ.py:2308-2336``), "so
  a run's compiled kernels can be cleaned, warmed or volume-mounted as one directory". FlashInfer's
  JIT workspace is ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>/``
  (``cached_ops/<module>/`` with ``<module>.so``, ``generated/``: ``flashinfer/jit/env.py:66-70,382-397``,
  ``flashinfer/jit/core.py:458-468``); SGLang's base would be the folder itself, and a compile
  cache holds nothing under a top-level ``.cache/`` (``kimi_deploy.hostside.boundary_names``), so the
  unit names ``flashinfer/``, beside FlashInfer's autotune results.
- its own: CuTe DSL objects (``cute_aot/``, ``srt/environ.py:1387``), its torch.compile cache
  (``torch_compile_cache/``, ``srt/compilation/backend.py:408-414``) and FlashInfer's autotune
  results (``flashinfer/autotune/``, ``srt/model_executor/runner/flashinfer_autotune.py:192-199``).
- ``jit/``: its JIT kernels, which do not follow ``SGLANG_CACHE_DIR`` (``SGLANG_JIT_CACHE_DIR``,
  else ``~/.cache/sglang/jit``: ``srt/environ.py:1397``, ``kernels/jit/utils/compile/cache.py:317-319``),
  so the unit names them inside.
"""

from __future__ import annotations

from kimi_deploy.engines.common import dist_init_flags, engine_unit_for, model_flags, size_flags
from kimi_deploy.engines.interface import Engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.plan.listen import bind_address
from kimi_deploy.plan.placement import Placement
from kimi_deploy.plan.servespec import Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_paths import engine_dir, model_dir, unit_cache_dir
from kimi_deploy.render.credentials import credential
from kimi_deploy.render.unit_env import common_env

UNIT = "kimi-sglang"
# SGLang reads its API key only from its options; a --config YAML file carries it, so the key never
# appears in argv. The file is root's alone; systemd hands SGLang a copy as a credential, which
# the engine user cannot change.
SECRET_CONFIG = "kimi-sglang.yaml"  # noqa: S105 - a file name
# The variable SGLang reads its cache folder from, and the folder, under the unit's cache folder.
CACHE_ENV = "SGLANG_CACHE_DIR"
CACHE_DIR = f"{unit_cache_dir(UNIT)}/sglang"


def cache_env(placement: Placement) -> dict[str, str]:
    """The unit's environment: what every engine gets, and SGLang's cache folder with its JIT
    kernels' and FlashInfer's inside (the recipe's ``env`` may name others)."""
    return {
        CACHE_ENV: CACHE_DIR,
        "SGLANG_JIT_CACHE_DIR": f"{CACHE_DIR}/jit",
        "FLASHINFER_WORKSPACE_BASE": f"{CACHE_DIR}/flashinfer",
        **common_env(placement),
    }


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
        env=cache_env(placement),
        secret_files=secret_files,
    )


def compile_cache(unit: Unit) -> str | None:
    """The folder SGLang keeps what it compiles at start in (DeepGEMM's, FlashInfer's, Triton's
    and its own JIT kernels, its torch.compile cache): the unit's ``SGLANG_CACHE_DIR``. Every
    launch compiles: SGLang builds its kernels at their first use, whatever its flags."""
    return unit.env.get(CACHE_ENV)


# SGLang's own lines about a start (0.5.23): the weights load, which it times
# (srt/model_executor/model_runner.py:1372-1379: "Load weight end. elapsed=%.2f s, ..."), and the
# rest of the start, from there to the line it prints once it serves
# (srt/entrypoints/http_server.py:2600): the KV pool, FlashInfer's autotune, the CUDA graphs'
# capture and its warm-up request, in which its kernels are compiled at their first use (DeepGEMM's
# "typically 10-20 mins" without a cache: srt/layers/deep_gemm_wrapper/compile_utils.py:150-192).
START_PHASES: dict[str, tuple[dict[str, object], ...]] = {
    "engine load": ({"took": r"Load weight end\. elapsed=([0-9]+(?:\.[0-9]+)?) s"},),
    "warm-up": ({"between": [r"Load weight end\.", r"The server is fired up and ready to roll!"]},),
}
READY_LINE = r"The server is fired up and ready to roll!"


# its --config YAML names the key as the option it sets (--api-key)
ENGINE = Engine(
    name="sglang",
    default_api_port=30000,
    unit=engine_unit,
    secret_file_key="api-key",  # noqa: S106 - the key's name in its config file
    hicache_refusal=None,
    # SGLang's share of its token pool in use (docs/references/production_metrics.md)
    kv_usage_metrics=("sglang:token_usage",),
    compile_cache=compile_cache,
    start_phases=START_PHASES,
    ready_line=READY_LINE,
)
