"""Reading a YAML mapping from a file with errors that name the file, line and rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kimi_deploy.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would keep the last one silently."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # ``<<: *anchor`` merges; keys written beside it override, as YAML says
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                "a mapping key must be a plain value, found a list or mapping",
                key_node.start_mark,
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Return the top-level mapping of a YAML file, or raise ``ConfigError``."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(shown, "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(shown, "", f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        raise ConfigError(where, "", f"YAML syntax: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(shown, "", f"YAML syntax: {exc}") from None
    except RecursionError:
        raise ConfigError(shown, "", "YAML nesting is too deep") from None
    if data is None:
        raise ConfigError(shown, "", "the file is empty, expected a mapping")
    if not isinstance(data, dict):
        raise ConfigError(shown, "", f"expected a mapping at top level, found {type(data).__name__}")
    return data
