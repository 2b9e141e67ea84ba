"""SGLang's rule for flags made from dataclass fields: ``add_cli_args_from_dataclass(parser, Cls)``
over fields annotated ``A[T, "help"]`` or ``A[T, Arg(...)]`` (``sglang.srt.arg_groups.arg_utils``)."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flag_catalog.args import ArgSpec, RecordField
from flag_catalog.consteval import Unresolved, as_sequence
from flag_catalog.resolve import ClassRef, where
from flag_catalog.values import Frame, RefVal, Val, const_str, val_to_const

if TYPE_CHECKING:
    from flag_catalog.interpreter import Extractor


def record_dataclass_loop(
    ex: Extractor,
    call: ast.Call,
    args: list[Val | None],
    kwargs: dict[str, Val | None],
    frame: Frame,
) -> None:
    """SGLang ``add_cli_args_from_dataclass(parser, Cls, fields=None)``."""
    origin = where(frame.module, call)
    target = args[1] if len(args) > 1 else kwargs.get("cls")
    if not (isinstance(target, RefVal) and isinstance(target.ref, ClassRef)):
        ex.warn(f"add_cli_args_from_dataclass on unresolved class at {origin}")
        return
    only: set[str] | None = None
    selected = kwargs.get("fields")
    if selected is not None:
        try:
            only = {str(v) for v in as_sequence(val_to_const(selected, ex.consts))}
        except Unresolved:
            ex.warn(f"unresolved fields= at {origin}")
    for rec in ex.dataclass_fields(target.ref):
        if only is not None and rec.name not in only:
            continue
        if rec.annotation is None:
            continue
        result = field_flag(ex, rec)
        if result is None:
            continue
        names, spec = result
        ex.add_flag(names, spec, f"{rec.module}.{rec.name} via {origin}")


def field_flag(ex: Extractor, rec: RecordField) -> tuple[list[str], ArgSpec] | None:
    assert rec.annotation is not None
    parts = ex.hints.annotated_parts(rec.module, rec.annotation)
    if parts is None:
        return None
    inner, metadata = parts
    meta: dict[str, ast.expr] | None = None
    for item in metadata:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            meta = {}
            break
        if isinstance(item, ast.Call):
            callee = ex.resolver.expr(rec.module, item.func)
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
        value = ex.consts.eval(rec.module, meta["cli_name"])
        if isinstance(value, str):
            cli_name = value
    names = [cli_name]
    if "aliases" in meta:
        try:
            names += [str(a) for a in as_sequence(ex.consts.eval(rec.module, meta["aliases"]))]
        except Unresolved:
            ex.warn(f"unresolved aliases for {rec.name}")
    dummy = Frame(rec.module, {}, None, None, None)
    explicit_choices: list[str] | None = None
    if "choices" in meta and not (isinstance(meta["choices"], ast.Constant) and meta["choices"].value is None):
        explicit_choices = ex.choices(meta["choices"], dummy)
    spec = ArgSpec()
    if "action" in meta and not (isinstance(meta["action"], ast.Constant) and meta["action"].value is None):
        action = ex.action_spec(meta["action"], dummy)
        if action is not None:
            spec = action
        action_kwargs = meta.get("action_kwargs")
        if isinstance(action_kwargs, ast.Dict):
            for key, item in zip(action_kwargs.keys, action_kwargs.values, strict=True):
                name = const_str(key) if key is not None else None
                if name is not None:
                    ex.apply_key(name, item, dummy, spec)
        return names, spec
    hints = [h for h in ex.hints.flatten(rec.module, inner) if h.kind != "none"]
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
            ex.apply_key("nargs", meta["nargs"], dummy, spec)
    return names, spec
