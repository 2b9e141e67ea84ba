"""The model architectures a release registers: the names a checkpoint's config.json
``architectures`` may hold for the engine to load it.

Two registry shapes are read:

* a table ``ARCH: (MODULE, CLASS)`` (vLLM's ``_VLLM_MODELS``). An architecture counts when MODULE is
  in the wheel and, run on the build's platform, binds CLASS: model packages pick their classes per
  platform at import (``vllm/models/kimi_k3/__init__.py`` imports none on a TPU platform, whose
  plugins register their own; ``vllm/models/glm5next/__init__.py`` raises on XPU). Module-level
  ``if`` tests on ``current_platform.is_<platform>()``, ``current_platform.device_type`` and
  ``TYPE_CHECKING`` are decided for that platform; any other test leaves both branches possible,
  and the architecture counts when one of them binds CLASS.
* ``EntryClass`` of every module of a package (SGLang, sglang-jax, TokenSpeed): the registry keys
  each class by its ``__name__``, so an alias counts under the name of the class it stands for.

and one more for a registry a function fills item by item: the string keys of ``NAME[KEY] = ...``
(tpu-inference's ``_MODEL_REGISTRY``).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

from flag_catalog.consteval import ConstEval, Unresolved
from flag_catalog.profiles import RegistrySource
from flag_catalog.resolve import ClassRef, Ref, Resolver, ValueRef
from flag_catalog.wheel import Module, Wheel

# vLLM's Platform.device_type per platform (vllm/platforms/*.py): ROCm's is "cuda".
_DEVICE_TYPE = {"cuda": "cuda", "rocm": "cuda", "cpu": "cpu", "xpu": "xpu", "tpu": "tpu"}
# Platform.is_cuda_alike(): CUDA or ROCm.
_ALIKE = {"cuda_alike": ("cuda", "rocm")}

BOUND, UNBOUND, RAISED = "bound", "unbound", "raised"


def _platform_test(expr: ast.expr, platform: str) -> bool | None:  # noqa: PLR0911 (one case per syntax form)
    """The value of a module-level ``if`` test on ``platform``; None when it depends on more."""
    if isinstance(expr, ast.Name) and expr.id == "TYPE_CHECKING":
        return False
    if isinstance(expr, ast.Attribute) and expr.attr == "TYPE_CHECKING":
        return False
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        inner = _platform_test(expr.operand, platform)
        return None if inner is None else not inner
    if isinstance(expr, ast.BoolOp):
        values = [_platform_test(v, platform) for v in expr.values]
        if isinstance(expr.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if (
        isinstance(expr, ast.Call)
        and not expr.args
        and isinstance(expr.func, ast.Attribute)
        and _is_platform(expr.func.value)
        and expr.func.attr.startswith("is_")
    ):
        kind = expr.func.attr[len("is_") :]
        if kind in _ALIKE:
            return platform in _ALIKE[kind]
        return kind == platform if kind in _DEVICE_TYPE else None
    if (
        isinstance(expr, ast.Compare)
        and len(expr.ops) == 1
        and isinstance(expr.ops[0], (ast.Eq, ast.NotEq))
        and isinstance(expr.left, ast.Attribute)
        and expr.left.attr == "device_type"
        and _is_platform(expr.left.value)
        and isinstance(expr.comparators[0], ast.Constant)
    ):
        same = _DEVICE_TYPE.get(platform) == expr.comparators[0].value
        return same if isinstance(expr.ops[0], ast.Eq) else not same
    return None


def _is_platform(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Name) and expr.id == "current_platform"


def _binds(st: ast.stmt, name: str) -> bool:
    if isinstance(st, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return st.name == name
    if isinstance(st, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name.split(".")[0]) == name for alias in st.names)
    if isinstance(st, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in st.targets)
    if isinstance(st, ast.AnnAssign):
        return isinstance(st.target, ast.Name) and st.target.id == name and st.value is not None
    return False


def _walk(stmts: Sequence[ast.stmt], name: str, platform: str, states: set[str]) -> set[str]:
    """The states (bound, unbound, raised) the module can be in after ``stmts``."""
    for st in stmts:
        if states <= {RAISED}:
            return states
        live = states - {RAISED}
        after = states & {RAISED}
        if isinstance(st, ast.Raise):
            after.add(RAISED)
        elif isinstance(st, ast.If):
            test = _platform_test(st.test, platform)
            if test is not False:
                after |= _walk(st.body, name, platform, set(live))
            if test is not True:
                after |= _walk(st.orelse, name, platform, set(live))
        elif isinstance(st, ast.Try):
            # an exception inside is caught or not: only its bindings are read
            body = [*st.body, *(s for h in st.handlers for s in h.body), *st.orelse, *st.finalbody]
            after |= {BOUND} if any(_binds(s, name) for s in _flat(body)) else live
        elif isinstance(st, ast.With):
            after |= _walk(st.body, name, platform, set(live))
        elif _binds(st, name):
            after.add(BOUND)
        else:
            after |= live
        states = after
    return states


def _flat(stmts: Sequence[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for st in stmts:
        out.append(st)
        if isinstance(st, (ast.If, ast.Try, ast.With)):
            out += _flat([*getattr(st, "body", []), *getattr(st, "orelse", [])])
    return out


def _lazy_names(mod: Module) -> set[str]:
    """Names a module-level ``__getattr__`` serves: those of its literal ``__all__``."""
    if not isinstance(mod.bindings.get("__getattr__"), ast.FunctionDef):
        return set()
    for st in mod.tree.body:
        if (
            isinstance(st, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in st.targets)
            and isinstance(st.value, (ast.List, ast.Tuple))
        ):
            return {e.value for e in st.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def loads_on(mod: Module, name: str, platform: str) -> bool:
    """Whether importing ``mod`` on ``platform`` can succeed with ``name`` bound."""
    if name in _lazy_names(mod):
        return True
    return BOUND in _walk(mod.tree.body, name, platform, {UNBOUND})


def model_table(wheel: Wheel, consts: ConstEval, source: RegistrySource, warn: Callable[[str], None]) -> list[str]:
    """The architectures of table ``source.name`` whose class the build loads (see the module doc)."""
    table = consts.ref(consts.resolver.symbol(source.module, source.name), None, 0)
    if not isinstance(table, dict):
        raise Unresolved("not a dict")
    platform = source.platform or ""
    top = source.module.split(".", 1)[0]
    package = source.module.rsplit(".", 1)[0]
    names: list[str] = []
    for arch, target in table.items():
        if not isinstance(arch, str):
            continue
        if not (isinstance(target, list) and len(target) == 2 and all(isinstance(t, str) for t in target)):
            warn(f"architecture {arch}: entry is not (MODULE, CLASS)")
            continue
        module_name, cls = str(target[0]), str(target[1])
        dotted = module_name if module_name.startswith(f"{top}.") else f"{package}.{module_name}"
        mod = wheel.module(dotted)
        if mod is None:
            warn(f"architecture {arch}: module {dotted} is not in the wheel")
            continue
        if not loads_on(mod, cls, platform):
            continue
        names.append(arch)
    if not names:
        raise Unresolved("no architecture found")
    return sorted(set(names))


def entry_classes(wheel: Wheel, resolver: Resolver, source: RegistrySource, warn: Callable[[str], None]) -> list[str]:
    """The ``__name__`` of every class in ``EntryClass`` of the modules directly in ``source.module``."""
    prefix = f"{source.module}."
    names: list[str] = []
    for dotted in sorted(wheel.members):
        if not dotted.startswith(prefix) or "." in dotted[len(prefix) :]:
            continue
        if dotted in wheel.packages and not source.packages:
            continue
        mod = wheel.module(dotted)
        if mod is None or source.name not in mod.bindings:
            continue
        entry = resolver.symbol(dotted, source.name)
        refs: list[Ref | None] = [entry]
        if isinstance(entry, ValueRef) and isinstance(entry.expr, (ast.List, ast.Tuple)):
            refs = [resolver.expr(entry.module, e) for e in entry.expr.elts]
        for ref in refs:
            if isinstance(ref, ClassRef):
                names.append(ref.node.name)
            else:
                warn(f"{dotted}.{source.name}: {resolver.dotted_name(ref) or 'a value'} is not a class of the wheel")
    if not names:
        raise Unresolved(f"no module of {source.module} has {source.name}")
    return sorted(set(names))


def subscript_keys(wheel: Wheel, source: RegistrySource) -> list[str]:
    """The string keys of every ``NAME[KEY] = ...`` in module ``source.module``, at any depth."""
    mod = wheel.module(source.module)
    if mod is None:
        raise Unresolved("module not found")
    names: list[str] = []
    for node in ast.walk(mod.tree):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id == source.name
                and isinstance(target.slice, ast.Constant)
                and isinstance(target.slice.value, str)
            ):
                names.append(target.slice.value)
    if not names:
        raise Unresolved(f"no {source.name}[...] = assignment")
    return sorted(set(names))
