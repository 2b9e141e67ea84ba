"""Name resolution."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from flag_catalog.profiles import PinnedName
from flag_catalog.wheel import Binding, ImportBinding, Module, Wheel


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
