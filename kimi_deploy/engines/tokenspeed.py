"""The TokenSpeed engine unit: ``tokenspeed serve`` (gateway + engine on rank 0, engine elsewhere).

What it compiles at start is kept in one folder under the unit's cache folder, its compile cache
(``kimi_deploy.compile_cache``). TokenSpeed names no such folder itself: the libraries it compiles
with each keep theirs where their own variable says, and the unit points each into
``/var/cache/kimi/kimi-tokenspeed/tokenspeed``. Paths are of the published wheels of the releases
``recipes/locks/releases/tokenspeed-0.1.1@*`` pins:

- ``deep_gemm/``: DeepGEMM's JIT cache (tokenspeed-deepgemm 2.8.0.post20260924), read from
  ``DG_JIT_CACHE_DIR`` (the prefix ``DG``: ``deep_gemm/csrc/runtime/jit.hpp:17-22``; ``JIT_CACHE_DIR``
  and the layout are compiled into ``deep_gemm/_C.cpython-312-x86_64-linux-gnu.so`` from
  ``deep_jit/cache/disk.hpp``), else ``$HOME/.dj``: a kernel at ``cache/<name>.<digest>/``
  (``kernel.cu``, ``kernel.cubin``, ``meta.json`` and the ``.committed`` mark), built in ``tmp/<uuid>``.
- ``flashinfer/``: FlashInfer's JIT workspace (flashinfer-python 0.7.1rc2),
  ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>/`` (``cached_ops/<module>/`` with
  ``<module>.so``, ``generated/``; the cubins it fetches in ``cubins/``: ``flashinfer/jit/env.py:66-70,
  114-115,355-370``, ``flashinfer/jit/core.py:467-468``); the base is a subfolder, since a compile
  cache holds nothing under a top-level ``.cache/`` (``kimi_deploy.hostside.boundary_names``).
- ``triton/``: Triton's kernels, ``TRITON_CACHE_DIR``, which both Tritons of the release read: the
  ``triton`` module (triton 3.8.0, ``triton/knobs.py:348``; default ``~/.triton/cache``) and
  ``tokenspeed_triton`` (tokenspeed-triton 3.9.10.post20261008, ``tokenspeed_triton/knobs.py:347``;
  default ``~/.triton/tokenspeed-cache``), TokenSpeed's own kernels' (``tokenspeed_kernel/_triton.py:42``).
  Each keeps a kernel in ``<key>/`` (``runtime/cache.py:36-56``), a key that holds its own version
  and a digest of its own compiler (``triton_key``, ``runtime/cache.py:284-316`` and ``:286-318``),
  so the two never take each other's.
- ``flashinfer-autotune/``: TokenSpeed's FlashInfer autotune results,
  ``TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR`` (tokenspeed-kernel 0.1.4
  ``tokenspeed_kernel/ops/tuning.py:55,178-181``; default ``$XDG_CACHE_HOME/tokenspeed/flashinfer-autotune``),
  a ``<digest>/autotune_configs.json`` per configuration and environment.
- ``torch_extensions/``: the C++ extensions TokenSpeed builds at first use with torch's
  ``load_inline`` (``tokenspeed_hostfunc_ext``: ``tokenspeed/runtime/utils/hostfunc.py:137-164``;
  ``tokenspeed_weak_ref_tensor``: ``tokenspeed_kernel/ops/transform/weak_ref.py:69-77``), in
  ``$TORCH_EXTENSIONS_DIR/<name>/`` (torch 2.14.0 ``torch/utils/cpp_extension.py:2813-2835``; default
  ``$XDG_CACHE_HOME/torch_extensions/<python>_<cuda>``, ``:525``).

It runs no ``torch.compile`` (inductor has nothing to keep).
"""

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
from kimi_deploy.releases.host_paths import engine_dir, model_dir, unit_cache_dir
from kimi_deploy.render.unit_env import common_env

UNIT = "kimi-tokenspeed"
MAX_PORT = 65535
# The one folder every library's compile cache is pointed into, under the unit's cache folder.
CACHE_DIR = f"{unit_cache_dir(UNIT)}/tokenspeed"
# Each library's variable, and its folder inside CACHE_DIR.
CACHE_ENVS = {
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TRITON_CACHE_DIR": "triton",
    "TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR": "flashinfer-autotune",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
}


def cache_env(placement: Placement) -> dict[str, str]:
    """The unit's environment: what every engine gets, and each library's compile cache inside
    ``CACHE_DIR`` (the recipe's ``env`` may name others)."""
    return {**{name: f"{CACHE_DIR}/{folder}" for name, folder in CACHE_ENVS.items()}, **common_env(placement)}


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
    env = cache_env(placement)
    unit = engine_unit_for(
        recipe, placement, name=UNIT, label="TokenSpeed", argv=argv, listens=listens, bind=bind, env=env
    )
    return replace(unit, local_listens=local)


def compile_cache(unit: Unit) -> str | None:
    """The folder TokenSpeed's libraries keep what they compile at start in (DeepGEMM's,
    FlashInfer's, Triton's kernels, its FlashInfer autotune results, its C++ extensions):
    ``CACHE_DIR``, while the unit's env points one of them there (a recipe's ``env`` may point
    any elsewhere). Every launch compiles: its kernels are built at their first use, whatever its
    flags."""
    inside = any(unit.env.get(name, "").startswith(f"{CACHE_DIR}/") for name in CACHE_ENVS)
    return CACHE_DIR if inside else None


ENGINE = Engine(name="tokenspeed", default_api_port=8000, unit=engine_unit, compile_cache=compile_cache)
