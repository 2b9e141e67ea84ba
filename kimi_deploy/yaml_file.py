"""Reading a YAML mapping from a file with errors that name the file, line and rule.

Aliases are bounded: a document whose values, aliases expanded, number more than
``MAX_VALUES``, or whose aliases repeat more than ``MAX_ALIASED_BYTES`` bytes of scalars, is
refused before anything reads them (a "billion laughs" file of a few hundred bytes would otherwise
make every later step walk a billion values; a few aliases of one long string, copy gigabytes).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from kimi_deploy.errors import ConfigError

# Values (scalars, lists, mappings) of a document with its aliases expanded: a recipe has hundreds.
MAX_VALUES = 100_000
# Bytes of scalars the aliases repeat, each alias counted at its expanded size: a recipe's anchors
# share a few lines (a pool's engine arguments), some KB; this leaves room for a benchmark prompt
# of 100,000 characters used by dozens of tasks. What the file writes out itself is not counted:
# it costs its own size.
MAX_ALIASED_BYTES = 8 << 20


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would keep the last one silently."""


# The same with libyaml's parser, where PyYAML was built with it (its wheels are): a recipe parses
# in a tenth of the time (1.5 against 12.6 ms for recipes/kimi-k3.1-pro.yaml), on every run. A
# file it refuses is read again by the loader above, whose messages (and limits) are the ones said.
class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """``_UniqueKeyLoader``'s constructors on libyaml's parser (PyYAML's pure-Python one without it)."""


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


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    try:
        return loader.construct_yaml_int(node)
    except ValueError:
        # Python reads at most sys.get_int_max_str_digits() decimal digits (4300) into an int.
        digits = sum(c.isdigit() for c in str(node.value))
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"an integer of {digits} digits is longer than Python reads ({sys.get_int_max_str_digits()} at most)",
            node.start_mark,
        ) from None


for _loader in (_UniqueKeyLoader, _FastLoader):
    _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    _loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _load(text: str, shown: str, kind: type[yaml.SafeLoader] = _UniqueKeyLoader) -> Any:
    """``yaml.load`` with our loader, the aliases' expansion bounded between composing the
    document and constructing its values."""
    loader = kind(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_values(node, shown)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_values(root: yaml.Node, shown: str) -> int:
    """How many values ``root`` holds with its aliases expanded; ``ConfigError`` past ``MAX_VALUES``,
    when its aliases repeat more than ``MAX_ALIASED_BYTES`` bytes of scalars, or for an alias inside
    the list or mapping it names. Each node is measured once (memoised), so a bomb is found in time
    linear in the file."""
    # node id -> (values, bytes of scalars) it expands to
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    aliased = 0

    def size(node: yaml.Node) -> tuple[int, int]:
        nonlocal aliased
        key = id(node)
        if key in sizes:
            # a node met again is an alias (the composer hands out the anchored node itself)
            aliased += sizes[key][1]
            if aliased > MAX_ALIASED_BYTES:
                rule = f"YAML aliases repeat more than {MAX_ALIASED_BYTES} bytes of values"
                raise ConfigError(shown, "", f"{rule} (an alias bomb?)")
            return sizes[key]
        if key in open_:
            raise ConfigError(shown, "", "a YAML alias refers to a list or mapping that contains it")
        values, size_bytes = 1, 0
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
            size_bytes = len(str(node.value).encode("utf-8", "surrogatepass"))
        open_.add(key)
        for child in children:
            child_values, child_bytes = size(child)
            values += child_values
            size_bytes += child_bytes
            if values > MAX_VALUES:
                rule = f"the document holds more than {MAX_VALUES} values with its YAML aliases expanded"
                raise ConfigError(shown, "", f"{rule} (an alias bomb?)")
        open_.discard(key)
        sizes[key] = values, size_bytes
        return sizes[key]

    return size(root)[0]


# a YAML mapping of any shape: the schema that reads it (pydantic) checks it
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
        try:
            data = _load(text, shown, _FastLoader)
        except (yaml.YAMLError, RecursionError):
            data = _load(text, shown)
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
