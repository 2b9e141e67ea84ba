"""The layers hold: the core is pure, and no layer keeps per-run state in module globals.

The core (``kimi_deploy``) imports nothing of pyinfra, of the facts, operations and deploys that
use it, nor of the local cluster; it reads no environment variable and no argv, and makes no
secrets (the controller's side passes them in). Per-run state lives in one run context
(``kimi_pyinfra.run_context``): no module of the controller keeps a mutable container at module
level or rebinds a global.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

CORE = "kimi_deploy"
# What the core never imports: the controller's side and what only it may use.
OUTSIDE_CORE = ("pyinfra", "pyinfra_cli", "gevent", "deploys", "kimi_pyinfra", "localcluster", "harness")
# The programs the hosts run (shipped alone, with the host modules they import: their own layer)
HOSTSIDE = "kimi_deploy/hostside"


def _sources(*folders: str, but: str | None = None) -> list[Path]:
    found = (p for folder in folders for p in (ROOT / folder).rglob("*.py"))
    return sorted(p for p in found if but is None or not p.is_relative_to(ROOT / but))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", _sources(CORE), ids=_rel)
def test_the_core_imports_nothing_of_the_controllers_side(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = [n for n in _imports(tree) if n.split(".")[0] in OUTSIDE_CORE]
    assert not bad, f"{_rel(path)} imports {', '.join(bad)}: the core stays pure"


@pytest.mark.parametrize("path", _sources(HOSTSIDE), ids=_rel)
def test_a_host_program_imports_only_the_standard_library_and_host_modules(path: Path) -> None:
    """A host program travels alone, with the host modules it imports (the bundle): anything else
    of the product is not on the host. (The weights sync's huggingface_hub is the release venv's.)"""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    ours = ("kimi_deploy", "kimi_pyinfra", "localcluster", "harness", "deploys", "tests")
    bad = [n for n in _imports(tree) if n.split(".")[0] in ours and not n.startswith("kimi_deploy.hostside")]
    assert not bad, f"{_rel(path)} imports {', '.join(bad)}: a host has only kimi_deploy.hostside"


@pytest.mark.parametrize("path", _sources(CORE, but=HOSTSIDE), ids=_rel)
def test_the_core_reads_no_environment_nor_argv_and_makes_no_secrets(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            pair = (node.value.id, node.attr)
            if pair in {("os", "environ"), ("os", "getenv"), ("sys", "argv"), ("os", "environb")}:
                found.append(f"{pair[0]}.{pair[1]} (line {node.lineno})")
        if isinstance(node, ast.Import | ast.ImportFrom) and "secrets" in _imports(node):
            found.append(f"the secrets module (line {node.lineno})")
    assert not found, f"{_rel(path)} uses {', '.join(found)}: the controller's side passes them in"


MUTATORS = {"append", "add", "update", "setdefault", "extend", "insert", "pop", "popitem", "clear", "discard", "remove"}


def _containers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a dict, list or set."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = node.value
            mutable = isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in {"dict", "list", "set"}
            )
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name) and mutable}
    return names


def module_state(source: str) -> list[str]:
    """What a module changes of its own globals: a module-level container it changes anywhere
    (item assignment or deletion, a mutating method), or a global it rebinds."""
    tree = ast.parse(source)
    containers = _containers(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found |= {f"global {name}" for name in node.names}
        target = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            target = node.func.value
        elif isinstance(node, ast.AugAssign):
            target = node.target
        if isinstance(target, ast.Name) and target.id in containers:
            found.add(target.id)
    return sorted(found)


@pytest.mark.parametrize("path", _sources(CORE, "kimi_pyinfra", but=HOSTSIDE), ids=_rel)
def test_no_module_keeps_mutable_state_at_module_level(path: Path) -> None:
    found = module_state(path.read_text(encoding="utf-8"))
    assert not found, f"{_rel(path)}: module-level state {', '.join(found)}: it belongs in the run context"


def test_the_checks_see_what_they_look_for() -> None:
    """The scans find the shapes they refuse (as the caches this project had were written)."""
    assert module_state("_last: dict[str, int] = {}\ndef f(k):\n    _last[k] = 1\n") == ["_last"]
    assert module_state("_ID: list[str] = []\ndef f():\n    _ID.append('x')\n") == ["_ID"]
    assert module_state("_last = None\ndef f():\n    global _last\n    _last = 1\n") == ["global _last"]
    assert module_state("TABLE = {'a': 1}\ndef f(k):\n    return TABLE[k]\n") == []
    assert _imports(ast.parse("from pyinfra.api import host\n")) == ["pyinfra.api"]


@pytest.mark.parametrize("path", _sources("bench", "lab/harness"), ids=_rel)
def test_benchmarks_and_their_harness_import_nothing_from_the_tests(path: Path) -> None:
    bad = [n for n in _imports(ast.parse(path.read_text(encoding="utf-8"))) if n.split(".")[0] == "tests"]
    assert not bad, f"{_rel(path)} imports {', '.join(bad)}: what bench/ shares with tests/ lives in harness/"


@pytest.mark.parametrize("path", _sources("bench", "tools", "lab"), ids=_rel)
def test_scripts_import_from_installed_packages_without_changing_the_path(path: Path) -> None:
    """bench/ and tools/ run as scripts of the installed product and lab (scripts/test installs
    both): no ``sys.path`` insertion stands in for an install."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert not found, f"{_rel(path)}: sys.path at line(s) {found}: import from the installed packages"


UNTYPED = "dict[str, Any]"


def untyped_without_reason(source: str) -> list[int]:
    """The lines holding ``dict[str, Any]`` with no comment on them or on the line above."""
    lines = source.splitlines()
    return [
        n + 1
        for n, line in enumerate(lines)
        if UNTYPED in line and "#" not in line and not (n and lines[n - 1].lstrip().startswith("#"))
    ]


@pytest.mark.parametrize("path", _sources(CORE, but=HOSTSIDE), ids=_rel)
def test_every_untyped_dict_in_the_core_says_why(path: Path) -> None:
    """The core's records are typed (TypedDicts, dataclasses); a ``dict[str, Any]`` is JSON of any
    shape (a recipe's JSON Schema, a host's text before it is checked), and says so."""
    found = untyped_without_reason(path.read_text(encoding="utf-8"))
    assert not found, f"{_rel(path)}: {UNTYPED} at line(s) {found} with no comment saying why it is untyped"


def test_the_untyped_scan_finds_what_it_refuses() -> None:
    assert untyped_without_reason("def f(x: dict[str, Any]) -> None:\n") == [1]
    assert untyped_without_reason("# any JSON\ndef f(x: dict[str, Any]) -> None:\n") == []
    assert untyped_without_reason("x: dict[str, Any] = {}  # any JSON\n") == []
