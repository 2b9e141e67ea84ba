"""Stand-in engine wheels for the local package index, built here as real, installable wheels.

``build_all(index_root)`` writes ``index_root/files/*.whl`` (what ``localcluster.pkgindex`` serves):
``vllm``, ``sglang`` and ``tokenspeed`` with their real console scripts and module paths running the
stand-in engine of ``standins/kimi_standin`` (shipped in each) with the flag catalog of the release
they stand in for, and ``fastsafetensors`` and ``nixl`` (empty modules: the GPU weight loader, and
NIXL, whose real wheels are CUDA builds that pull torch in, for the KV transfers the stand-in engines
do not make; the deploy relies on nothing of either but that its pin installs in the release). The
routers are the real wheels from PyPI (``localcluster.pypi_mirror``): they run on CPU, as does the
Mooncake client and master of mooncake-transfer-engine.
Wheels are byte-for-byte reproducible (fixed timestamps and order): rebuilding changes no file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from kimi_deploy.releases.catalog import CatalogMissing, catalogs, load_catalog

STANDINS = Path(__file__).resolve().parent / "standins"
ENGINE_PACKAGE = "kimi_standin"
# Read by standins/kimi_standin/cmdline.py from inside the engine's package (same name there).
CATALOG_FILE = "kimi_standin_catalog.json"
REQUIRES_PYTHON = ">=3.10"
DEFAULT_RELEASES: dict[str, list[str]] = {
    "vllm": ["0.34.0", "0.34.1"],
    "sglang": ["0.5.23"],
    "tokenspeed": ["0.1.1"],
    "fastsafetensors": ["0.5.0"],
    "nixl": ["1.5.1"],
}
# The earliest time a zip entry can carry: a wheel's bytes must not depend on when it was built.
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Project:
    package: str  # top-level import package
    sources: dict[str, str] = field(default_factory=dict)  # path in the wheel -> file under standins/
    scripts: dict[str, str] = field(default_factory=dict)  # console script -> entry point
    engine: str | None = None  # ships kimi_standin and this engine's flag catalog


PROJECTS: dict[str, Project] = {
    "vllm": Project(
        "vllm",
        {"vllm/entrypoints/cli/main.py": "vllm_cli_main.py"},
        {"vllm": "vllm.entrypoints.cli.main:main"},
        engine="vllm",
    ),
    "sglang": Project(
        "sglang",
        {"sglang/cli/main.py": "sglang_cli_main.py", "sglang/launch_server.py": "sglang_launch_server.py"},
        {"sglang": "sglang.cli.main:main"},
        engine="sglang",
    ),
    "tokenspeed": Project(
        "tokenspeed",
        {"tokenspeed/cli.py": "tokenspeed_cli.py"},
        {"tokenspeed": "tokenspeed.cli:main", "ts": "tokenspeed.cli:main"},
        engine="tokenspeed",
    ),
    "fastsafetensors": Project("fastsafetensors"),
    "nixl": Project("nixl"),
}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in re.split(r"[.+-]", version))


def catalog_source(engine: str, version: str) -> str:
    """The release whose committed catalog a stand-in of ``engine`` ``version`` carries: its own, or
    else the newest older one (a patch release changes no flag: vLLM 0.34.1 gets 0.34.0's)."""
    have = sorted((stem.removeprefix(f"{engine}-") for stem in catalogs(engine)), key=_version_key)
    if version in have:
        return version
    older = [v for v in have if _version_key(v) < _version_key(version)]
    if not older:
        raise CatalogMissing(f"no flag catalog for {engine} {version} or an older release (have: {', '.join(have)})")
    return older[-1]


def catalog_json(engine: str, version: str) -> bytes:
    """The catalog shipped in the wheel: ``base``/``additions`` already merged, ``version`` the wheel's."""
    source = catalog_source(engine, version)
    catalog = load_catalog(engine, source)
    data = {
        "engine": engine,
        "version": version,
        "catalog_of": source,
        "flags": {
            name: {"takes_value": flag.takes_value, "choices": list(flag.choices) if flag.choices is not None else None}
            for name, flag in sorted(catalog.flags.items())
        },
        "aliases": dict(sorted(catalog.aliases.items())),
        "registries": {key: list(names) for key, names in sorted(catalog.registries.items())},
    }
    return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()


def dist_name(project: str) -> str:
    """The name as it appears in wheel and ``.dist-info`` names (PEP 427: runs of ``-_.`` become ``_``)."""
    return re.sub(r"[-_.]+", "_", project)


def _members(project: str, version: str) -> dict[str, bytes]:
    spec = PROJECTS[project]
    files = {path: (STANDINS / source).read_bytes() for path, source in spec.sources.items()}
    if spec.engine is not None:
        for source in sorted((STANDINS / ENGINE_PACKAGE).glob("*.py")):
            files[f"{ENGINE_PACKAGE}/{source.name}"] = source.read_bytes()
        files[f"{spec.package}/{CATALOG_FILE}"] = catalog_json(spec.engine, version)
    top = f'"""Local-cluster stand-in for {project} {version} (kimi-deploy tests)."""\n\n__version__ = "{version}"\n'
    files.setdefault(f"{spec.package}/__init__.py", top.encode())
    # Every directory on the way to a module is a regular package, as in the real wheels.
    for path in list(files):
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            files.setdefault("/".join([*parts[:depth], "__init__.py"]), b"")
    return files


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(project: str, version: str) -> tuple[str, bytes]:
    """``(file name, bytes)`` of the stand-in wheel of ``project`` ``version``."""
    if project not in PROJECTS:
        raise ValueError(f"no stand-in for {project!r} (have: {', '.join(sorted(PROJECTS))})")
    name = dist_name(project)
    info = f"{name}-{version}.dist-info"
    spec = PROJECTS[project]
    metadata = (
        f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
        f"Summary: kimi-deploy local-cluster stand-in for {project} {version} (no model, no accelerator)\n"
        f"Requires-Python: {REQUIRES_PYTHON}\n"
    )
    wheel = "Wheel-Version: 1.0\nGenerator: kimi-deploy localcluster.wheels\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    members = dict(sorted(_members(project, version).items()))
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = wheel.encode()
    if spec.scripts:
        lines = "".join(f"{script} = {target}\n" for script, target in sorted(spec.scripts.items()))
        members[f"{info}/entry_points.txt"] = f"[console_scripts]\n{lines}".encode()
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in members.items():
            entry = zipfile.ZipInfo(path, date_time=_EPOCH)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.create_system = 3  # Unix, so that the mode below is honoured
            entry.external_attr = 0o100644 << 16
            archive.writestr(entry, data, compresslevel=9)
    return f"{name}-{version}-py3-none-any.whl", buffer.getvalue()


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def build_all(index_root: Path, releases: dict[str, list[str]] | None = None) -> list[Path]:
    """Write the wheels of ``releases`` (project -> versions; default DEFAULT_RELEASES) into
    ``index_root/files``; files already holding the same bytes are left alone. Other files stay."""
    files = index_root / "files"
    files.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    for project, versions in sorted((releases or DEFAULT_RELEASES).items()):
        for version in versions:
            filename, data = build_wheel(project, version)
            _write_if_changed(files / filename, data)
            out.append(files / filename)
    return out
