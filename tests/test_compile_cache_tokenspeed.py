"""TokenSpeed's compile cache made on one host and placed on another, run locally on loopback.

The same programs as ``tests/test_compile_cache_sglang.py`` (pack, the weights' relay, place), with
an engine folder laid out as the libraries of TokenSpeed 0.1.1's release leave it, every path taken
from the unit's own environment as each library reads it (``kimi_deploy/engines/tokenspeed.py``
cites each layout):

- DeepGEMM (tokenspeed-deepgemm 2.8.0.post20260924), at ``$DG_JIT_CACHE_DIR``: a kernel per
  ``cache/<name>.<digest>/`` (``kernel.cu``, ``kernel.cubin``, ``meta.json`` and its ``.committed``
  mark);
- FlashInfer 0.7.1rc2, at ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<archs>/``: a JIT
  module's ``cached_ops/<module>/`` (``build.ninja``, objects, ``<module>.so``), its lock in
  ``cached_ops/tmp/``, its generated source in ``generated/``;
- both Tritons' kernels at ``$TRITON_CACHE_DIR/<key>/``, each under its own key;
- its FlashInfer autotune results at ``$TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR/<digest>/autotune_configs.json``;
- its C++ extension at ``$TORCH_EXTENSIONS_DIR/tokenspeed_weak_ref_tensor/`` (``main.cpp``,
  ``build.ninja``, ``main.o``, the ``.so``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_compile_cache_key import _engine, _plan
from tests.test_compile_cache_sglang import carried, deep_gemm_kernel, flashinfer_module

pytestmark = pytest.mark.processes

# tokenspeed-multi's hosts are H200s, compute capability 9.0: FlashInfer's folder "90a"
ARCH = "90a"
DG_KERNEL = "sm90_fp8_gemm_1d2d.3e9a0c71b5d24f68a1c09e7b2f4d6a85"
EXT = "tokenspeed_weak_ref_tensor"


def _engine_files(env: dict[str, str]) -> dict[str, bytes]:
    """What a start leaves, by absolute path on the engine's host, each where ``env`` sends it."""
    flashinfer = f"{env['FLASHINFER_WORKSPACE_BASE']}/.cache/flashinfer/0.7.1rc2/{ARCH}"
    triton = env["TRITON_CACHE_DIR"]
    autotune = f"{env['TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR']}/5b0e27c9a4f1d3862e7c90ab"
    extension = f"{env['TORCH_EXTENSIONS_DIR']}/{EXT}"
    return {
        **deep_gemm_kernel(env["DG_JIT_CACHE_DIR"], DG_KERNEL, "sm90_fp8_gemm_1d2d"),
        **flashinfer_module(flashinfer),
        f"{triton}/7TQ2XKPL2M4VHN7BWTRYC5D8FGA1ES0UIO9QWERTYZABCDEFGH/_kda_fwd_kernel.cubin": os.urandom(30_000),
        f"{triton}/7TQ2XKPL2M4VHN7BWTRYC5D8FGA1ES0UIO9QWERTYZABCDEFGH/_kda_fwd_kernel.json": b'{"num_warps": 4}',
        f"{triton}/M4VHN7BWTRYC5D8FGA1ES0UIO9QWERTYZABCDEFGH7TQ2XKPL2/_fused_moe_kernel.cubin": os.urandom(20_000),
        f"{autotune}/autotune_configs.json": b'{"config": {}, "environment": {"gpu": "NVIDIA H200"}}',
        f"{extension}/main.cpp": b"#include <torch/extension.h>\n",
        f"{extension}/build.ninja": b"ninja_required_version = 1.3\n",
        f"{extension}/main.o": os.urandom(20_000),
        f"{extension}/{EXT}.so": os.urandom(40_000),
    }


def test_tokenspeeds_caches_are_packed_and_land_where_the_units_env_points_the_engine(tmp_path: Path) -> None:
    unit = _engine(_plan(), "h200-01")
    files = _engine_files(dict(unit.env))
    other = carried(tmp_path, unit, files)
    # the other host's engine finds each file, byte for byte, where its env sends the library
    for path, data in files.items():
        assert (other / path.lstrip("/")).read_bytes() == data, path
