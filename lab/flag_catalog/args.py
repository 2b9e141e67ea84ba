"""Argument semantics."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from flag_catalog.consteval import Const

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
