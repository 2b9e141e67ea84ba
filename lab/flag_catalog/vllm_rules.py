"""vLLM's rule for flags made from dataclass fields: ``get_kwargs(Cls)`` gives each field's argparse
kwargs, and the field's annotation decides them as ``vllm.engine.arg_utils._compute_kwargs``
does (bool -> BooleanOptionalAction, Literal -> choices, ``bool | str | None`` -> optional value)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flag_catalog.args import ArgSpec, RecordField
from flag_catalog.hints import Hints
from flag_catalog.values import FieldKwargsVal

if TYPE_CHECKING:
    from flag_catalog.interpreter import Extractor


def apply_field(ex: Extractor, value: FieldKwargsVal, spec: ArgSpec) -> None:
    """``**get_kwargs(Cls)["field"]`` -> vLLM's _compute_kwargs semantics."""
    fields = {f.name: f for f in ex.dataclass_fields(value.kwargs.cls)}
    rec = fields.get(value.name)
    if rec is None:
        ex.warn(f"field {value.name} not found on {value.kwargs.cls.node.name}")
        return
    derived = field_spec(ex.hints, rec)
    spec.value, spec.boolean_optional, spec.choices = (
        derived.value,
        derived.boolean_optional,
        derived.choices,
    )
    removed = value.kwargs.removed_choices.get(value.name)
    if removed and spec.choices is not None:
        spec.choices = [c for c in spec.choices if c not in removed]
    for key, override in value.kwargs.overrides.get(value.name, {}).items():
        ex.apply_key(key, override.expr, override.frame, spec)


def field_spec(hints: Hints, rec: RecordField) -> ArgSpec:  # noqa: PLR0911 (one case per syntax form)
    flat = hints.flatten(rec.module, rec.annotation)
    kinds = {h.kind for h in flat}
    if "dataclass" in kinds:
        return ArgSpec("required")
    if kinds == {"bool", "str", "none"}:
        return ArgSpec("optional")
    if "bool" in kinds:
        return ArgSpec("none", boolean_optional=True)
    if "literal" in kinds:
        if "str" in kinds:
            return ArgSpec("required")
        values = [v for h in flat if h.kind == "literal" for v in h.values]
        return ArgSpec("required", choices=sorted(set(values)))
    for hint in flat:
        if hint.kind in {"list", "tuple", "set"}:
            inner_lits = [v for h in hint.inner if h.kind == "literal" for v in h.values]
            inner_kinds = {h.kind for h in hint.inner}
            if inner_lits and inner_kinds <= {"literal", "none"}:
                return ArgSpec("required", choices=sorted(set(inner_lits)))
            return ArgSpec("required")
    return ArgSpec("required")
