"""Whether a JSON value conforms to a type of ``hostside.probe_types``, key for key: a TypedDict's
required keys present, no key it does not name, every value of its declared type."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin, get_type_hints, is_typeddict


def problems(value: Any, kind: Any, where: str = "answer") -> list[str]:
    """Every place ``value`` departs from ``kind`` (empty: it conforms)."""
    if kind is Any:
        return []
    origin = get_origin(kind)
    if origin in (Union, types.UnionType):
        options = [problems(value, k, where) for k in get_args(kind)]
        return [] if any(not p for p in options) else [f"{where}: {value!r} is none of {kind}"]
    if kind is type(None):
        return [] if value is None else [f"{where}: {value!r} is not null"]
    if is_typeddict(kind):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not an object ({kind.__name__})"]
        hints = get_type_hints(kind)
        out = [f"{where}: {key!r} missing ({kind.__name__})" for key in kind.__required_keys__ if key not in value]
        out += [f"{where}: {key!r} is not a key of {kind.__name__}" for key in value if key not in hints]
        for key, item in value.items():
            if key in hints:
                out += problems(item, hints[key], f"{where}.{key}")
        return out
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not an object"]
        key_kind, item_kind = get_args(kind)
        out = []
        for key, item in value.items():
            out += problems(key, key_kind, f"{where} key")
            out += problems(item, item_kind, f"{where}[{key!r}]")
        return out
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} is not a list"]
        (item_kind,) = get_args(kind)
        return [p for i, item in enumerate(value) for p in problems(item, item_kind, f"{where}[{i}]")]
    if kind in (bool, int, str, float):
        # JSON's true is not a number here, nor a number a flag
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        return [] if ok else [f"{where}: {value!r} is not {kind.__name__}"]
    raise TypeError(f"no check for {kind!r}")
