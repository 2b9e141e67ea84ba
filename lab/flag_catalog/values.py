"""The abstract interpreter's values (a parser, a reference, a string, a sequence, kwargs of a
dataclass field, ...), its frames and the helpers that read functions' shapes."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from flag_catalog.consteval import Const, ConstEval, Unresolved
from flag_catalog.profiles import MAIN_BLOCK
from flag_catalog.resolve import (
    ClassRef,
    FuncRef,
    Ref,
    decorator_names,
)


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
    ParserVal | RefVal | BoundMethodVal | SuperVal | StrVal | SeqVal | ConstVal | DictVal | KwargsVal | FieldKwargsVal
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
