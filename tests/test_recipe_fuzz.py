"""Property tests: whatever is done to the recipe, ``load_recipe`` returns a Recipe or ONE line.

Every mutation starts from the real recipe. The invariant checked everywhere: either a ``Recipe``
comes back, or a ``ConfigError`` whose text is a single line starting with the file path; no
other exception type escapes. Some mutations also have an exact expected error.

Keys and strings may hold line breaks and integers may be far beyond 64 bits: both once broke the
one-line rule (a raw key in the field path; ``size_bytes * 1.1`` overflowing a float).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import load_recipe
from kimi_pyinfra.cli import main
from tests.conftest import PROD, RECIPE, ROOT
from tests.locked_site import API_KEY_ENV, locked_site

Key = Any
TreePath = tuple[Key, ...]

RECIPE_TEXT = (ROOT / RECIPE).read_text(encoding="utf-8")
BASE: dict[str, Any] = yaml.safe_load(RECIPE_TEXT)

FUZZ = settings(
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Every character str.splitlines() breaks on, so that they turn up often in keys and values.
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"

_text = st.text(max_size=20) | st.text(alphabet=st.sampled_from(f"ab:#- {_LINE_BREAKS}"), max_size=8)
_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-100, max_value=-1),
    st.integers(min_value=2**64, max_value=10**400),
    st.floats(),
    st.just(""),
    _text,
    st.text(alphabet=st.characters(min_codepoint=0x80), max_size=8),
)
_keys: st.SearchStrategy[Any] = st.one_of(_text, st.integers(min_value=-5, max_value=5))
_values: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(_text, children, max_size=3),
    ),
    max_leaves=6,
)

# Mappings whose keys are names the user picks; every other mapping is a schema object.
_NAME_MAPS = {"engines", "routers", "stores", "topologies", "pools", "env", "packages", "accelerator_hour"}
# Values the schema takes as they are (a JSON schema, OpenAI tool definitions, a call's arguments):
# no key under them is the recipe's.
_FREE_FORM = {"json_schema", "tools", "arguments"}


def _walk(node: Any, prefix: TreePath = ()) -> list[tuple[TreePath, Any]]:
    """Every (path, value) under ``node``, the root included."""
    out: list[tuple[TreePath, Any]] = [(prefix, node)]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_walk(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out.extend(_walk(value, (*prefix, index)))
    return out


def _get(tree: Any, path: TreePath) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _dump(tree: Any) -> str:
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


Draw = Callable[[st.SearchStrategy[Any]], Any]


def _not_a(current: Any) -> Callable[[Any], bool]:
    return lambda value: type(value) is not type(current)


def _not_in(mapping: dict[Any, Any]) -> Callable[[Any], bool]:
    return lambda key: key not in mapping


def _one_char_edit(draw: Draw, key: str) -> str:
    kind = draw(st.sampled_from(["insert", "delete", "replace"] if key else ["insert"]))
    char: str = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz_-0123456789"))
    if kind == "insert":
        at: int = draw(st.integers(0, len(key)))
        return key[:at] + char + key[at:]
    at = draw(st.integers(0, len(key) - 1))
    return key[:at] + ("" if kind == "delete" else char) + key[at + 1 :]


@st.composite
def mutated_trees(draw: st.DrawFn) -> dict[str, Any]:
    """The real recipe after 1-3 random deletions, replacements (of any type, or of another type
    than the value replaced), insertions of unknown keys and one-character renames of keys."""
    tree = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        nodes = _walk(tree)
        kind = draw(st.sampled_from(["delete", "replace", "retype", "insert", "rename"]))
        if kind in ("delete", "replace", "retype"):
            path, current = draw(st.sampled_from([n for n in nodes if n[0]]))
            parent = _get(tree, path[:-1])
            if kind == "delete":
                del parent[path[-1]]
            elif kind == "retype":
                parent[path[-1]] = draw(_values.filter(_not_a(current)))
            else:
                parent[path[-1]] = draw(_values)
        elif kind == "insert":
            mappings = [p for p, v in nodes if isinstance(v, dict)]
            mapping = _get(tree, draw(st.sampled_from(mappings)))
            key = draw(_keys.filter(_not_in(mapping)))
            mapping[key] = draw(_values)
        else:
            keyed = [p for p, _ in nodes if p and isinstance(p[-1], str)]
            if not keyed:
                continue
            path = draw(st.sampled_from(keyed))
            parent = _get(tree, path[:-1])
            new = _one_char_edit(draw, path[-1])
            if new not in parent:
                parent[new] = parent.pop(path[-1])
    return tree


def _check(path: Path) -> Recipe | ConfigError:
    """``load_recipe`` returns a Recipe or raises one line starting with the path; nothing else."""
    try:
        return load_recipe(path)
    except ConfigError as exc:
        error = exc
    text = str(error)
    assert text.splitlines() == [text], f"not one line: {text!r}"
    assert text.startswith(str(path)), text
    assert error.message, f"empty message: {text!r}"
    return error


def _fields_of(path: tuple[Any, ...]) -> set[str]:
    """The schema's keys of the object at ``path`` (pydantic's field names of its model)."""
    model: Any = Recipe
    names = False  # the part is a name in a mapping (a topology, a pool, an engine)
    for part in path:
        if names:
            names = False
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return set()
        names = getattr(field.annotation, "__origin__", None) is dict
        model = _model_in(field.annotation)
    return set(model.model_fields) if model is not None and not names else set()


def _model_in(annotation: Any) -> Any:
    """The pydantic model an annotation holds: itself, an optional one, or a dict's values."""
    if hasattr(annotation, "model_fields"):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(tree=mutated_trees())
def test_mutated_tree(work: Path, tree: dict[str, Any]) -> None:
    path = work / "tree.yaml"
    path.write_text(_dump(tree), encoding="utf-8")
    _check(path)


@FUZZ
@given(data=st.data())
def test_one_char_rename_of_a_schema_key_is_an_unknown_key(work: Path, data: st.DataObject) -> None:
    tree = copy.deepcopy(BASE)
    schema_keys = [
        p
        for p, _ in _walk(tree)
        if p and isinstance(p[-1], str) and not (len(p) >= 2 and p[-2] in _NAME_MAPS) and not _FREE_FORM & set(p[:-1])
    ]
    path = data.draw(st.sampled_from(schema_keys))
    parent = _get(tree, path[:-1])
    old = path[-1]
    new = _one_char_edit(data.draw, old)
    # Another key of the same object (tp -> dp, packages -> package) is not a typo; neither is an
    # existing key.
    if new in parent or new in _fields_of(path[:-1]):
        return
    parent[new] = parent.pop(old)
    file = work / "rename.yaml"
    file.write_text(_dump(tree), encoding="utf-8")
    result = _check(file)
    assert isinstance(result, ConfigError)
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in (*path[:-1], new)).lstrip(".")
    assert result.field == field
    assert re.fullmatch(r"unknown key( \(did you mean '[^']+'\?\))?", result.message), result.message
    if len(old) >= 5:
        # A one-character slip in a long key is always recognised: the hint is the original key
        # or another key exactly as close (``porls`` is as near ``ports`` as ``pools``).
        hint = re.fullmatch(r"unknown key \(did you mean '([^']+)'\?\)", result.message)
        assert hint is not None, result.message
        closeness = difflib.SequenceMatcher(None, new, hint.group(1)).ratio()
        assert closeness >= difflib.SequenceMatcher(None, new, old).ratio()


_NUMBERS: st.SearchStrategy[Any] = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=0),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=False),
)


@FUZZ
@given(data=st.data())
def test_any_number_in_place_of_a_number(work: Path, data: st.DataObject) -> None:
    """Sizes, ports, counts and lengths at any magnitude and sign: a Recipe or one line."""
    tree = copy.deepcopy(BASE)
    numbers = [p for p, v in _walk(tree) if type(v) in (int, float)]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(numbers))
        _get(tree, path[:-1])[path[-1]] = data.draw(_NUMBERS)
    file = work / "numbers.yaml"
    file.write_text(_dump(tree), encoding="utf-8")
    _check(file)


# Control characters a unit file would read as the end of a line, or a terminal as a command.
_CONTROL = st.sampled_from([*_LINE_BREAKS, "\x00", "\x07", "\t", "\x1b", "\x7f", "\x9b"])


@FUZZ
@given(data=st.data())
def test_a_control_character_in_any_string_is_refused(work: Path, data: st.DataObject) -> None:
    """Every string of a recipe may reach a unit file: one with a control character never loads.
    A benchmark task's prompt goes to the engine alone: its line feeds and tabs are its own."""
    tree = copy.deepcopy(BASE)
    strings = [p for p, v in _walk(tree) if isinstance(v, str)]
    path = data.draw(st.sampled_from(strings))
    value: str = _get(tree, path)
    at = data.draw(st.integers(0, len(value)))
    char = data.draw(_CONTROL)
    _get(tree, path[:-1])[path[-1]] = value[:at] + char + value[at:]
    if path[-1] == "prompt" and "tasks" in path and char in "\n\t":
        text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=False)
        file = work / "control.yaml"
        file.write_text(text, encoding="utf-8")
        assert isinstance(_check(file), Recipe)
        return
    # Escaped, so that YAML keeps the character (written raw, a line break folds into a space).
    text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=False)
    assert yaml.safe_load(text) == tree
    file = work / "control.yaml"
    file.write_text(text, encoding="utf-8")
    assert isinstance(_check(file), ConfigError)


_KEY_LINE = re.compile(r"^( *)([A-Za-z0-9_.-]+):(?: |$)")


@FUZZ
@given(data=st.data())
def test_duplicated_key_line_names_line_column_and_key(work: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from(["original", "dumped"]))
    lines = (RECIPE_TEXT if source == "original" else _dump(BASE)).splitlines(keepends=True)
    candidates = [i for i, line in enumerate(lines) if _KEY_LINE.match(line)]
    index = data.draw(st.sampled_from(candidates))
    match = _KEY_LINE.match(lines[index])
    assert match is not None
    file = work / "dup.yaml"
    file.write_text("".join([*lines[: index + 1], lines[index], *lines[index + 1 :]]), encoding="utf-8")
    result = _check(file)
    assert isinstance(result, ConfigError)
    column = len(match.group(1)) + 1
    key = yaml.safe_load(match.group(2) + ": 0")
    key = next(iter(key))
    assert str(result) == f"{file}:{index + 2}:{column}: YAML syntax: duplicate key {key!r}"


@FUZZ
@given(original=st.booleans(), tree=mutated_trees(), cut=st.floats(min_value=0.0, max_value=1.0))
def test_truncated_text(work: Path, original: bool, tree: dict[str, Any], cut: float) -> None:
    raw = (RECIPE_TEXT if original else _dump(tree)).encode("utf-8")
    file = work / "cut.yaml"
    file.write_bytes(raw[: int(len(raw) * cut)])
    _check(file)


@FUZZ
@given(junk=st.binary(max_size=300), at=st.floats(min_value=0.0, max_value=1.0), splice=st.booleans())
def test_random_bytes(work: Path, junk: bytes, at: float, splice: bool) -> None:
    raw = RECIPE_TEXT.encode("utf-8")
    offset = int(len(raw) * at)
    file = work / "bytes.yaml"
    file.write_bytes(raw[:offset] + junk + raw[offset:] if splice else junk)
    _check(file)


def test_the_strategies_reach_both_outcomes(work: Path) -> None:
    """Guard against a fuzzer that only ever produces errors (or only valid recipes).

    Derandomized, so that the count is the same on every run.
    """
    outcomes: list[bool] = []

    @settings(
        deadline=None,
        max_examples=300,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(tree=mutated_trees())
    def run(tree: dict[str, Any]) -> None:
        file = work / "outcome.yaml"
        file.write_text(_dump(tree), encoding="utf-8")
        outcomes.append(isinstance(_check(file), Recipe))

    run()
    assert outcomes.count(True) >= 1, outcomes.count(True)
    assert outcomes.count(False) >= 100, outcomes.count(False)


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@settings(
    deadline=None,
    max_examples=12,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tree=mutated_trees())
def test_cli_validate_prints_one_line_and_exits_2(work: Path, tree: dict[str, Any]) -> None:
    file = work / "cli.yaml"
    file.write_text(_dump(tree), encoding="utf-8")
    loaded = _check(file)
    code, out, err = _run_cli(["validate", str(file), PROD])
    if isinstance(loaded, ConfigError):
        # the one line as a terminal shows it: a control character of the file's written as its escape
        assert (code, out, err) == (2, "", f"{printable(str(loaded))}\n")
        return
    # A valid recipe still needs the engine flag catalogs to plan, and its checkpoints' locks and
    # keys to converge: either outcome is clean lines, each naming the recipe or the lock at fault.
    if code == 0:
        assert err == ""
        assert out.startswith(f"ok: {file} x {PROD}: ")
    else:
        assert code == 2
        assert out == ""
        assert err.endswith("\n")
        assert err.strip()
        for line in err.splitlines():
            assert line.startswith((f"{file}: ", "recipes/locks/")), line


def test_cli_validate_on_the_real_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every topology but tpu7x, which no published TPU engine release serves: one line naming it
    (where the checkpoints have locks and the API key is set)."""
    monkeypatch.chdir(locked_site(tmp_path))
    for name, value in API_KEY_ENV.items():
        monkeypatch.setenv(name, value)
    code, out, err = _run_cli(["validate", RECIPE, PROD])
    assert (code, out) == (2, "")
    assert err.startswith(f"{RECIPE}: topologies.tpu7x: sglang-jax 0.1.0rc0 does not register ")
    assert err.splitlines() == [err.rstrip("\n")]
    for topology in ("gb300-pd", "single-node", "tokenspeed-multi", "tokenspeed-single"):
        code, out, err = _run_cli(["validate", RECIPE, PROD, "--topology", topology])
        assert (code, err) == (0, "")
        assert out.startswith(f"ok: {RECIPE} x {PROD}: ")
        assert out.endswith(f" in {topology}\n")


def test_cli_missing_recipe_file(work: Path) -> None:
    missing = work / "missing.yaml"
    assert _run_cli(["validate", str(missing), PROD]) == (
        2,
        "",
        f"{missing}: cannot read: No such file or directory\n",
    )
