"""Turning a pydantic validation failure into one ``ConfigError`` line."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import shown

_PREFIXES = ("Value error, ", "Assertion failed, ")
_MAPPING_TYPES = {"model_type", "model_attributes_type", "dict_type"}
_SHOW_INPUT = {
    "literal_error",
    "string_pattern_mismatch",
    "enum",
    "greater_than_equal",
    "less_than_equal",
    "greater_than",
    "less_than",
    "too_short",
    "too_long",
    "string_too_short",
    "string_too_long",
}


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _found(value: Any) -> str:
    text = shown(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _unwrap(annotation: Any) -> list[Any]:
    """The model classes an annotation can hold, looking through Optional, Annotated, dict, list."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _unwrap(arg)]
    if origin is dict:
        return [("mapping", m) for m in _unwrap(typing.get_args(annotation)[1])]
    if origin is list:
        return [("sequence", m) for m in _unwrap(typing.get_args(annotation)[0])]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def allowed_keys(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Keys the schema allows in the mapping at ``loc`` (empty when unknown)."""
    current: Any = model
    for part in loc:
        if isinstance(current, tuple):
            current = current[1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        fields = {(f.alias or n): f for n, f in current.model_fields.items()}
        if part not in fields:
            return []
        options = _unwrap(fields[str(part)].annotation)
        if not options:
            return []
        current = options[0]
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [(f.alias or n) for n, f in current.model_fields.items()]
    return []


def first_error_line(where: str, exc: ValueError, model: type[BaseModel]) -> ConfigError:
    """The first problem of ``exc`` as a ``ConfigError``; unknown keys get a "did you mean" hint."""
    if not isinstance(exc, ValidationError):
        return ConfigError(where, "", str(exc))
    errors = exc.errors(include_url=False)
    # A typo shows up twice (unknown key + missing key): the unknown key with its hint is the fix.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(err["loc"])
    kind = err["type"]
    msg = str(err["msg"])
    for prefix in _PREFIXES:
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if kind == "extra_forbidden":
        parent = loc[:-1]
        allowed = allowed_keys(model, parent)
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        msg = "unknown key" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    elif kind == "missing":
        msg = "required key is missing"
    elif kind in _MAPPING_TYPES:
        msg = f"expected a mapping, found {_found(err.get('input'))}"
    elif kind.endswith("_type") or kind in _SHOW_INPUT:
        msg = f"{msg}, found {_found(err.get('input'))}"
    return ConfigError(where, _field_path(loc), msg)
