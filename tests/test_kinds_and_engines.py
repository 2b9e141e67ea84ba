"""Accelerator kinds and engines are units: one module each behind one interface, found by name.

No code outside ``kimi_deploy/accelerators/`` compares an accelerator kind's name, and none
outside ``kimi_deploy/engines/`` compares an engine's: a new kind or engine is a module and a line
of its registry (docs/add-an-accelerator-kind.md), not a branch in the files that use it. The
recipe's schema asks both through the rules its reader passes in, and imports neither.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import get_args

import pytest
from pydantic import ValidationError

from kimi_deploy.accelerators import KINDS
from kimi_deploy.accelerators.interface import AcceleratorKind
from kimi_deploy.engines import ENGINES
from kimi_deploy.recipe import EngineName, Recipe, Rules
from kimi_deploy.recipe_file import RULES, recipe_from
from tests.conftest import ROOT
from tests.test_recipe_errors import BASE

# Where the product's code lives: the core, the controller's side and the host programs.
PRODUCT = ("kimi_deploy", "kimi_pyinfra", "deploys")
VENDORS = frozenset(KINDS)
# Words that are a kind's name and something else too, where they mean the other thing.
HOMONYMS = {
    ("kimi_deploy/hostside/hardware_probe.py", "cpu"): "a key of /proc/cpuinfo (the CPU's model on some machines)"
}
ENGINE_NAMES = frozenset(ENGINES)


def _sources(outside: str) -> list[Path]:
    return sorted(p for f in PRODUCT for p in (ROOT / f).rglob("*.py") if not p.is_relative_to(ROOT / outside))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _constants(node: ast.expr) -> list[str]:
    """The string constants an operand of a comparison holds (itself, or a literal container's)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [v for e in node.elts for v in _constants(e)]
    return []


def compared(source: str, names: frozenset[str]) -> list[str]:
    """Each comparison (``==``, ``!=``, ``in``, ``not in``, ``match``'s case) with one of ``names``, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands, line = [node.left, *node.comparators], node.lineno
        elif isinstance(node, ast.MatchValue):
            operands, line = [node.value], node.value.lineno
        else:
            continue
        hits = sorted({v for o in operands for v in _constants(o) if v in names})
        found += [f"line {line}: {v!r}" for v in hits]
    return found


@pytest.mark.parametrize("path", _sources("kimi_deploy/accelerators"), ids=_rel)
def test_no_code_outside_the_accelerator_kinds_compares_a_kinds_name(path: Path) -> None:
    names = frozenset(n for n in VENDORS if (_rel(path), n) not in HOMONYMS)
    found = compared(path.read_text(encoding="utf-8"), names)
    assert not found, f"{_rel(path)} compares an accelerator kind's name ({', '.join(found)}): ask its AcceleratorKind"


@pytest.mark.parametrize("path", _sources("kimi_deploy/engines"), ids=_rel)
def test_no_code_outside_the_engines_compares_an_engines_name(path: Path) -> None:
    found = compared(path.read_text(encoding="utf-8"), ENGINE_NAMES)
    assert not found, f"{_rel(path)} compares an engine's name ({', '.join(found)}): ask its Engine"


def test_the_scan_sees_the_comparisons_it_refuses() -> None:
    names = frozenset({"tpu", "vllm"})
    assert compared("if vendor == 'tpu':\n    pass\n", names) == ["line 1: 'tpu'"]
    assert compared("x = engine in ('sglang', 'vllm')\n", names) == ["line 1: 'vllm'"]
    assert compared("match v:\n    case 'tpu':\n        pass\n", names) == ["line 2: 'tpu'"]
    assert compared("env = {'JAX_PLATFORMS': 'tpu'}\n", names) == []


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_schema_imports_neither_engines_nor_accelerator_kinds() -> None:
    """The units read the schema's types; the schema asks them only through ``Rules``."""
    imported = _imports(ROOT / "kimi_deploy/recipe.py")
    units = sorted(n for n in imported if n.startswith(("kimi_deploy.engines", "kimi_deploy.accelerators")))
    assert not units, f"kimi_deploy/recipe.py imports {units}"


@pytest.mark.parametrize("path", sorted((ROOT / "kimi_deploy/accelerators").glob("*.py")), ids=_rel)
def test_accelerator_kinds_import_no_engine(path: Path) -> None:
    engines = sorted(n for n in _imports(path) if n.startswith("kimi_deploy.engines"))
    assert not engines, f"{_rel(path)} imports {engines}: an engine reads its accelerators' kind, not the reverse"


def test_every_kind_module_is_registered_under_its_own_name() -> None:
    modules = {p.stem for p in (ROOT / "kimi_deploy/accelerators").glob("*.py")} - {"__init__", "interface"}
    kinds = {m for m in modules if "_" not in m}  # nvidia_drivers, nvidia_models: parts of a kind
    assert kinds == set(KINDS)
    assert set(ENGINES) == set(get_args(EngineName))


def _tpu_recipe(vendor: str) -> dict[str, object]:
    tree = copy.deepcopy(BASE)
    tree["topologies"]["tpu7x"]["accelerators"]["vendor"] = vendor
    return tree


def test_an_unregistered_kind_is_refused_with_the_kinds_there_are() -> None:
    with pytest.raises(ValidationError) as caught:
        recipe_from(_tpu_recipe("amd"))
    assert f"vendor: expected one of {sorted(KINDS)!r}, found 'amd'" in str(caught.value)


def test_a_new_kind_is_a_module_and_a_line_of_the_registry() -> None:
    """A kind the registry gains validates and plans through the same interface, with its
    defaults: one device an accelerator, no drivers step, the count and model compared."""
    amd = AcceleratorKind(name="amd")
    rules = Rules(vendors={**KINDS, amd.name: amd}, engines=ENGINES)
    recipe = Recipe.model_validate(_tpu_recipe("amd"), context=rules)
    topo = recipe.topologies["tpu7x"]
    assert topo.accelerators.vendor == "amd"
    assert topo.host_machine == "x86_64"
    assert amd.devices_per_accelerator(topo.accelerators.model) == 1
    assert RULES.vendors.keys() == KINDS.keys()


def test_the_schema_refuses_to_validate_without_the_rules() -> None:
    with pytest.raises(TypeError, match=r"kimi_deploy\.recipe_file"):
        Recipe.model_validate(copy.deepcopy(BASE))
