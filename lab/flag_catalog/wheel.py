"""Wheel access and module symbol tables."""

from __future__ import annotations

import ast
import email.parser
import hashlib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias


@dataclass(frozen=True)
class ImportBinding:
    module: str
    attr: str | None


@dataclass(frozen=True)
class ValueBinding:
    expr: ast.expr


Binding: TypeAlias = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef | ImportBinding | ValueBinding


@dataclass
class Module:
    name: str
    is_package: bool
    tree: ast.Module
    source: str
    bindings: dict[str, Binding]
    classes: dict[str, ast.ClassDef]


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


def absolute_module(current: str, is_package: bool, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = current.split(".")
    if not is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    if module:
        return f"{base}.{module}" if base else module
    return base


def collect_bindings(
    stmts: Sequence[ast.stmt],
    current: str,
    is_package: bool,
    out: dict[str, Binding],
    classes: dict[str, ast.ClassDef] | None = None,
) -> None:
    """Record the names a block binds; runtime branches win over TYPE_CHECKING."""
    for st in stmts:
        if isinstance(st, ast.ClassDef):
            out[st.name] = st
            if classes is not None:
                classes[st.name] = st
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[st.name] = st
        elif isinstance(st, ast.Import):
            for alias in st.names:
                if alias.asname:
                    out[alias.asname] = ImportBinding(alias.name, None)
                else:
                    top = alias.name.split(".")[0]
                    out[top] = ImportBinding(top, None)
        elif isinstance(st, ast.ImportFrom):
            mod = absolute_module(current, is_package, st.module, st.level)
            for alias in st.names:
                if alias.name == "*":
                    continue
                out[alias.asname or alias.name] = ImportBinding(mod, alias.name)
        elif isinstance(st, ast.Assign):
            for target in st.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = ValueBinding(st.value)
        elif isinstance(st, ast.AnnAssign):
            if isinstance(st.target, ast.Name) and st.value is not None:
                out[st.target.id] = ValueBinding(st.value)
        elif isinstance(st, ast.If):
            if _is_type_checking(st.test):
                collect_bindings(st.body, current, is_package, out, classes)
                collect_bindings(st.orelse, current, is_package, out, classes)
            else:
                collect_bindings(st.orelse, current, is_package, out, classes)
                collect_bindings(st.body, current, is_package, out, classes)
        elif isinstance(st, ast.Try):
            for handler in st.handlers:
                collect_bindings(handler.body, current, is_package, out, classes)
            collect_bindings(st.body, current, is_package, out, classes)
            collect_bindings(st.orelse, current, is_package, out, classes)
        elif isinstance(st, ast.With):
            collect_bindings(st.body, current, is_package, out, classes)


class Wheel:
    """A wheel opened as a zip; modules are parsed lazily and cached.

    ``companions`` are wheels of other distributions installed with it (a gateway the engine
    starts): their modules resolve as if installed beside the wheel's, which wins a module both
    have; metadata and console scripts are the wheel's own.
    """

    def __init__(self, path: Path, companions: Sequence[Path] = ()) -> None:
        self.path = path
        self.zip = zipfile.ZipFile(path)
        self.members: dict[str, str] = {}
        self.packages: set[str] = set()
        self.dist_info = _dist_info(self.zip)
        self._zip_of: dict[str, zipfile.ZipFile] = {}
        self.companions = tuple(Wheel(c) for c in companions)
        for source in (self, *self.companions):
            for name in source.zip.namelist():
                top = name.split("/", 1)[0]
                if top.endswith(".dist-info") or not name.endswith(".py") or ".data/" in name:
                    continue
                dotted = name[:-3].replace("/", ".")
                if dotted.endswith(".__init__"):
                    dotted = dotted[: -len(".__init__")]
                    self.packages.add(dotted)
                if dotted not in self.members:
                    self.members[dotted] = name
                    self._zip_of[name] = source.zip
        self._cache: dict[str, Module | None] = {}
        self.parse_failures: list[str] = []

    def read_text(self, member: str) -> str:
        return self._zip_of.get(member, self.zip).read(member).decode("utf-8", errors="replace")

    def has_module(self, name: str) -> bool:
        return name in self.members

    def module(self, name: str) -> Module | None:
        if name in self._cache:
            return self._cache[name]
        member = self.members.get(name)
        mod: Module | None = None
        if member is not None:
            source = self.read_text(member)
            try:
                tree = ast.parse(source, filename=member)
            except SyntaxError as exc:
                self.parse_failures.append(f"{member}: {exc}")
            else:
                bindings: dict[str, Binding] = {}
                classes: dict[str, ast.ClassDef] = {}
                is_package = name in self.packages
                collect_bindings(tree.body, name, is_package, bindings, classes)
                mod = Module(name, is_package, tree, source, bindings, classes)
        self._cache[name] = mod
        return mod

    def metadata(self) -> dict[str, str]:
        """The first value of each field of the wheel's METADATA: an RFC 822 header (the core
        metadata spec), whose fields may run on over indented lines, a License text for one."""
        text = self.read_text(f"{self.dist_info}/METADATA")
        headers = email.parser.HeaderParser().parsestr(text)
        out: dict[str, str] = {}
        for key, value in headers.items():
            out.setdefault(key, str(value).strip())
        return out

    def requirements(self) -> list[str]:
        """Every Requires-Dist of the wheel's METADATA, as written."""
        text = self.read_text(f"{self.dist_info}/METADATA")
        headers = email.parser.HeaderParser().parsestr(text)
        return [str(value).strip() for value in headers.get_all("Requires-Dist") or []]

    def console_scripts(self) -> dict[str, str]:
        member = f"{self.dist_info}/entry_points.txt"
        if member not in self.zip.namelist():
            return {}
        section = ""
        scripts: dict[str, str] = {}
        for raw in self.read_text(member).splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
                continue
            if section == "console_scripts":
                key, _, value = line.partition("=")
                scripts[key.strip()] = value.strip()
        return scripts


def _dist_info(zf: zipfile.ZipFile) -> str:
    for name in zf.namelist():
        top = name.split("/", 1)[0]
        if top.endswith(".dist-info"):
            return top
    return ""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
