"""Type hints of dataclass fields."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from flag_catalog.consteval import ConstEval, Unresolved, choice_strings
from flag_catalog.resolve import ClassRef, Ref, Resolver, ValueRef, decorator_names


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
                origin = self.resolver.dotted_name(self.resolver.expr(origin_ref.module, target)).rsplit(".", 1)[-1]
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
