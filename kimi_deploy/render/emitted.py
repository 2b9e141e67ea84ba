"""Everything a plan emits that some other program reads: each unit's flags and environment
variables, the keys of the config files it reads, the directives of its systemd unit.

Read from the plan and the files ``render_host`` makes of it (secret files rendered with a
placeholder in every secret), so what is listed is exactly what a deploy writes; the fidelity
ledger (``kimi_deploy.render.fidelity_ledger``) asks each item for its source.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml

from kimi_deploy.converge.plan import hosted_fallback, key_names
from kimi_deploy.extras import need
from kimi_deploy.plan.servespec import HostPlan, Plan, Unit
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.files import UNIT_DIR, RenderedFile, render_host

Kind = Literal["flag", "env", "config", "unit"]
KINDS: tuple[Kind, ...] = ("flag", "env", "config", "unit")
# Who reads a unit file's directives, and a gateway's config.
SYSTEMD = "systemd"
PLACEHOLDER = "placeholder-secret"
# Blocks whose entries are values, not directives (map: "~^[A-Z]+ /" 1;).
_VALUE_BLOCKS = {"map", "types"}


@dataclass(frozen=True)
class Emission:
    """One thing a unit of ``topology`` hands to ``program``: ``kind`` ``name`` (a flag such as
    ``--tensor-parallel-size``, a variable, ``mooncake.json: mode``, ``[Service] User``), with
    the value the first host of the topology gives it ("" for a switch or a file's key)."""

    topology: str
    unit: str
    program: str
    kind: Kind
    name: str
    value: str


def program(unit: Unit) -> str:
    """The release that reads ``unit``'s command line: the release folder its program runs from
    (``/opt/kimi/engines/vllm-0.34.0+nixl-1.5.1/bin/vllm`` -> ``vllm-0.34.0``, the packages after
    ``+`` being its pins), else the program's name (``/usr/sbin/nginx`` -> ``nginx``)."""
    path = PurePosixPath(unit.argv[0])
    if path.parent.name == "bin":
        return path.parent.parent.name.split("+", 1)[0]
    return path.name


def _flags(unit: Unit) -> Iterator[tuple[str, str]]:
    argv = unit.argv
    for i, word in enumerate(argv[1:], start=1):
        if not word.startswith("-"):
            continue
        if word.startswith("--") and "=" in word:
            name, value = word.split("=", 1)
            yield name, value
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        yield word, "" if nxt.startswith("-") else nxt


def _nginx_directives(content: str) -> Iterator[str]:
    """The directives of an nginx config, read by crossplane (nginx's own config parser for
    Python) as nginx reads them; entries of a ``map`` block are values, not directives."""
    crossplane = need("crossplane")  # the extra kimi-deploy[ledger]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nginx.conf"
        path.write_text(content, encoding="utf-8")
        parsed = crossplane.parse(str(path), single=True, strict=False, check_ctx=False, check_args=False)
    if parsed["status"] != "ok":
        raise ValueError(f"nginx config does not parse: {parsed['errors']}")

    def walk(block: list[dict[str, object]]) -> Iterator[str]:
        for d in block:
            name = str(d["directive"])
            yield name
            inner = d.get("block")
            if isinstance(inner, list) and name not in _VALUE_BLOCKS:
                yield from walk(inner)

    yield from walk(parsed["config"][0]["parsed"])


def _unit_directives(content: str) -> Iterator[tuple[str, str]]:
    section = ""
    continued = False
    for raw in content.splitlines():
        line = raw.strip()
        if continued:
            continued = line.endswith("\\")
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line
            continue
        key, _, value = line.partition("=")
        continued = line.endswith("\\")
        yield f"{section} {key}", value.rstrip("\\").strip()


def _env_lines(content: str) -> Iterator[tuple[str, str]]:
    """``(name, value)`` of each assignment of a systemd environment file."""
    for raw in content.splitlines():
        line = raw.strip()
        if line and not line.startswith(("#", ";")):
            name, _, value = line.partition("=")
            yield name, value


def _config_keys(f: RenderedFile) -> Iterator[tuple[str, str]]:
    """``(name, value)`` of each key of a config file a unit reads, by the file's format."""
    base = PurePosixPath(f.path).name
    if base.endswith(".json"):
        for key, value in json.loads(f.content).items():
            yield f"{base}: {key}", json.dumps(value) if not isinstance(value, str) else value
    elif base.endswith(".yaml"):
        for key in yaml.safe_load(f.content):
            yield f"{base}: {key}", PLACEHOLDER
    elif base.endswith((".conf", ".nginx")):
        for directive in _nginx_directives(f.content):
            yield f"nginx.conf: {directive}", ""
    else:
        yield base, ""  # a program the unit runs (the gateway's JavaScript): cited whole


def _secrets(spec: HostPlan, recipe: Recipe) -> dict[str, str]:
    hosted = hosted_fallback(recipe, spec) is not None
    names = key_names(recipe, spec) + (["KIMI_FALLBACK_API_KEY"] if hosted else [])
    return dict.fromkeys(names, PLACEHOLDER)


def host_emissions(recipe: Recipe, spec: HostPlan) -> Iterator[Emission]:
    """What ``spec``'s host is handed, unit by unit."""
    files = {f.path: f for f in render_host(recipe, spec, _secrets(spec, recipe))}
    config = recipe.paths.config
    for unit in spec.units:
        reader = program(unit)

        def item(kind: Kind, name: str, value: str, by: str = reader, unit: Unit = unit) -> Emission:
            return Emission(spec.topology, unit.name, by, kind, name, value)

        for name, value in _flags(unit):
            yield item("flag", name, value)
        for env_file in (f"{config}/{unit.name}.env", f"{config}/secrets/{unit.name}.env"):
            if env_file in files:
                for name, value in _env_lines(files[env_file].content):
                    yield item("env", name, value)
        for path in [*unit.files, *unit.secret_files]:
            for name, value in _config_keys(files[path]):
                yield item("config", name, value)
        for name, value in _unit_directives(files[f"{UNIT_DIR}/{unit.name}.service"].content):
            yield item("unit", name, value, by=SYSTEMD)


def emissions(recipe: Recipe, plan: Plan) -> list[Emission]:
    """Each distinct ``(topology, unit, program, kind, name)`` the plan emits, with the value of
    its first host, in plan order."""
    seen: dict[tuple[str, str, str, Kind, str], Emission] = {}
    for spec in plan.hosts:
        for e in host_emissions(recipe, spec):
            seen.setdefault((e.topology, e.unit, e.program, e.kind, e.name), e)
    return list(seen.values())
