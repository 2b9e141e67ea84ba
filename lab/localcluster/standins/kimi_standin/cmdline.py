"""The pinned release's command line: its flag catalog (shipped in the wheel) and argv parsed like argparse."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

# Written next to each engine package by localcluster/wheels.py (same name there).
CATALOG_FILE = "kimi_standin_catalog.json"

_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d+)?")
# vLLM reads human-readable sizes: lower case is decimal, upper case binary ("32k" = 32000, "32K" = 32768).
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgG]?)")
_MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


class UsageError(Exception):
    """A command line the release's argparse rejects: ``PROG: error: <message>``, exit 2."""


@dataclass(frozen=True)
class Flag:
    takes_value: bool
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class Catalog:
    engine: str
    version: str
    flags: dict[str, Flag]
    aliases: dict[str, str]
    registries: dict[str, tuple[str, ...]]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Catalog:
        flags = {
            name: Flag(bool(info["takes_value"]), tuple(info["choices"]) if info.get("choices") is not None else None)
            for name, info in data["flags"].items()
        }
        return cls(
            engine=str(data["engine"]),
            version=str(data["version"]),
            flags=flags,
            aliases={str(k): str(v) for k, v in data.get("aliases", {}).items()},
            registries={str(k): tuple(v) for k, v in data.get("registries", {}).items()},
        )


def load_catalog(package: str) -> Catalog:
    """The catalog shipped inside the installed package ``package`` (``vllm``, ``sglang``, ...)."""
    text = resources.files(package).joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return Catalog.from_json(data)


@dataclass
class ParsedArgs:
    """Flags by their canonical name (aliases resolved); the last occurrence of a flag wins, as in argparse."""

    positionals: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)

    def value(self, flag: str) -> str | None:
        return self.values.get(flag)

    def integer(self, flag: str, default: int | None = None, *, human: bool = False) -> int | None:
        raw = self.values.get(flag)
        if raw is None:
            return default
        parsed = _human_int(raw) if human else _plain_int(raw)
        if parsed is None:
            raise UsageError(f"argument {flag}: invalid int value: {raw!r}")
        return parsed


def _plain_int(raw: str) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def _human_int(raw: str) -> int | None:
    match = _HUMAN_INT.fullmatch(raw.strip())
    if match is None:
        return None
    number, suffix = match.groups()
    scaled = float(number) * _MULTIPLIERS[suffix]
    return int(scaled) if scaled == int(scaled) else None


def _is_value(arg: str) -> bool:
    # argparse takes "-1" as a value, not as an option, when no option looks like a number.
    return not arg.startswith("-") or arg == "-" or _NEGATIVE_NUMBER.fullmatch(arg) is not None


def parse(
    tokens: list[str],
    catalog: Catalog,
    *,
    positionals: int,
    underscores: bool,
    required: tuple[str, ...] = (),
) -> ParsedArgs:
    """Parse ``tokens`` against ``catalog``; raise UsageError with argparse's wording on what it rejects.

    ``positionals`` is how many positional arguments the subcommand takes (vLLM's model); with
    ``underscores`` ``--max_model_len`` means ``--max-model-len`` (vLLM's FlexibleArgumentParser).
    A flag taking several values (``nargs='+'``) consumes one here.
    """
    out = ParsedArgs()
    unknown: list[str] = []
    i = 0
    while i < len(tokens):
        arg = tokens[i]
        i += 1
        if arg == "--":
            out.positionals.extend(tokens[i:])
            break
        if _is_value(arg):
            out.positionals.append(arg)
            continue
        name, eq, inline = arg.partition("=")
        if underscores and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        canonical = catalog.aliases.get(name, name)
        flag = catalog.flags.get(canonical)
        if flag is None:
            unknown.append(arg)
            continue
        if not flag.takes_value:
            if eq:
                raise UsageError(f"argument {canonical}: ignored explicit argument {inline!r}")
            out.switches.add(canonical)
            continue
        if eq:
            value = inline
        elif i < len(tokens) and _is_value(tokens[i]):
            value = tokens[i]
            i += 1
        else:
            raise UsageError(f"argument {canonical}: expected one argument")
        if flag.choices is not None and value not in flag.choices:
            shown = ", ".join(repr(c) for c in flag.choices)
            raise UsageError(f"argument {canonical}: invalid choice: {value!r} (choose from {shown})")
        out.values[canonical] = value
    missing = [flag for flag in required if flag not in out.values]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)}")
    if len(out.positionals) > positionals:
        unknown.extend(out.positionals[positionals:])
        del out.positionals[positionals:]
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    return out
