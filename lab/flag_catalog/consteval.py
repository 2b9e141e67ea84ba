"""Constant evaluation (choices, registries)."""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable

from flag_catalog.resolve import ClassRef, FuncRef, Ref, Resolver, ValueRef, class_body_member
from flag_catalog.wheel import Binding, collect_bindings


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
        if isinstance(expr, ast.DictComp):
            return self.dict_comprehension(module, expr, local, depth + 1)
        raise Unresolved(type(expr).__name__)

    def dict_comprehension(self, module: str, expr: ast.DictComp, local: LocalLookup | None, depth: int) -> Const:
        """``{k: v for TARGET in ITERABLE if TEST}`` over a constant iterable, one ``for`` clause
        (vLLM's model registry merges ``{k: (mod, arch) for k, (mod, arch) in X.items() if ...}``)."""
        if len(expr.generators) != 1 or expr.generators[0].is_async:
            raise Unresolved("comprehension with several clauses")
        clause = expr.generators[0]
        items = as_sequence(self.eval(module, clause.iter, local, depth + 1))
        out: dict[object, Const] = {}
        for item in items:
            names: dict[str, Const] = {}
            bind_target(clause.target, item, names)

            def scoped(name: str, names: dict[str, Const] = names) -> Const | None:
                if name in names:
                    return names[name]
                return local(name) if local is not None else None

            if all(self.eval(module, test, scoped, depth + 1) for test in clause.ifs):
                out[self.eval(module, expr.key, scoped, depth + 1)] = self.eval(module, expr.value, scoped, depth + 1)
        return out

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
        if isinstance(func, ast.Attribute) and func.attr in {"keys", "copy", "items"} and not expr.args:
            base = self.eval(module, func.value, local, depth + 1)
            if isinstance(base, dict) and func.attr == "items":
                return [[key, value] for key, value in base.items()]
            if isinstance(base, dict):
                return list(base.keys()) if func.attr == "keys" else dict(base)
            if isinstance(base, list):
                return list(base)
            raise Unresolved(".keys()")
        ref = self.resolver.expr(module, func)
        name = self.resolver.dotted_name(ref)
        if (
            name in {"builtins.list", "builtins.tuple", "builtins.sorted", "builtins.set", "builtins.frozenset"}
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


def bind_target(target: ast.expr, value: Const, out: dict[str, Const]) -> None:
    """The names a ``for`` target binds to ``value`` (a name, or nested tuples of names)."""
    if isinstance(target, ast.Name):
        out[target.id] = value
        return
    if isinstance(target, (ast.Tuple, ast.List)):
        items = as_sequence(value)
        if len(items) != len(target.elts):
            raise Unresolved("unpacking")
        for elt, item in zip(target.elts, items, strict=True):
            bind_target(elt, item, out)
        return
    raise Unresolved(f"target {type(target).__name__}")


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
