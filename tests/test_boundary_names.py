"""The rule for file names inside a model revision (``hostside/boundary_names.py``): the names the
Hub lists, a lock holds and the host programs turn into paths they write and delete as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_deploy.hostside.boundary_names import BadName, check_name, check_names, inside
from kimi_deploy.hostside.boundary_text import shown

REAL_NAMES = [
    "model-00001-of-00096.safetensors",
    "model.safetensors.index.json",
    ".gitattributes",
    "tokenizer/tokenizer.json",
    "original/consolidated.00.pth",
    "dir with space/ünïcode.json",
    "a[1]*?.bin",  # glob characters are plain characters in a name
]


@pytest.mark.parametrize("name", REAL_NAMES)
def test_names_a_revision_really_holds_are_accepted(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("../../../../etc/cron.d/x", "must not have an empty, '.' or '..' segment, found '..'"),
        ("shards/../../escape", "must not have an empty, '.' or '..' segment, found '..'"),
        ("/etc/passwd", "must be relative (no leading '/')"),
        ("a//b", "must not have an empty, '.' or '..' segment, found ''"),
        ("a/", "must not have an empty, '.' or '..' segment, found ''"),
        ("./a", "must not have an empty, '.' or '..' segment, found '.'"),
        ("..", "must not have an empty, '.' or '..' segment, found '..'"),
        ("", "must not be empty"),
        ("..\\..\\etc\\passwd", "must not hold a backslash"),
        ("a\nExecStart=/bin/sh", "must not hold control character or surrogate U+000A"),
        ("a\x00b", "must not hold control character or surrogate U+0000"),
        ("a\x7fb", "must not hold control character or surrogate U+007F"),
        ("a\x9bb", "must not hold control character or surrogate U+009B"),
        ("a\ud800b", "must not hold control character or surrogate U+D800"),
        ("x" * 256, "must not have a segment over 255 bytes"),
        ("a/" * 600 + "b", "must be at most 1024 characters"),
        (".kimi/verify-cache.json", "must not be under .kimi/ (the revision folder's own state)"),
        (".cache/huggingface/download/x.incomplete", "must not be under .cache/ (the revision folder's own state)"),
        (7, "must be a string"),
    ],
)
def test_a_name_that_could_leave_the_revision_is_refused_in_one_line_naming_the_rule(name: object, rule: str) -> None:
    with pytest.raises(BadName) as caught:
        check_name(name)
    assert caught.value.rule == rule
    assert str(caught.value) == f"model file name {shown(name)}: {rule}"
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 250  # a huge name is cut, not printed whole


def test_every_name_of_a_lock_is_checked() -> None:
    assert check_names({"a.bin": [1, "x"], "b/c.json": [2, "y"]}) == ["a.bin", "b/c.json"]
    with pytest.raises(BadName, match="'/etc/passwd'"):
        check_names({"a.bin": [1, "x"], "/etc/passwd": [2, "y"]})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["a", ".", "/", "\\", "..", "\n", "\x00", "é", "~", "*"]), max_size=24).map("".join))
def test_whatever_a_name_holds_an_accepted_one_stays_inside_the_revision(name: str) -> None:
    root = "/srv/models/org--name/rev"
    try:
        check_name(name)
    except BadName as exc:
        refusal = str(exc)
    else:
        refusal = ""
    if refusal:
        assert "\n" not in refusal
        return
    path = os.path.normpath(os.path.join(root, name))
    assert path.startswith(root + "/")
    assert path == os.path.join(root, name)  # nothing to normalise: the name is already plain


def test_inside_follows_symlinks_and_refuses_a_path_that_leaves_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "rev", tmp_path / "outside"
    (root / "shards").mkdir(parents=True)
    outside.mkdir()
    (root / "linked-out").symlink_to(outside)
    (root / "file-out.bin").symlink_to(outside / "victim")
    (root / "linked-in").symlink_to(root / "shards")
    assert inside(str(root), "shards/a.bin") == str(root / "shards/a.bin")
    # A link that stays inside is a path like any other; the path returned is the link's, unresolved.
    assert inside(str(root), "linked-in/a.bin") == str(root / "linked-in/a.bin")
    for name in ("linked-out/victim", "file-out.bin"):
        with pytest.raises(BadName, match=f"model file name '{name}': resolves to .*outside") as caught:
            inside(str(root), name)
        assert "\n" not in str(caught.value)
    with pytest.raises(BadName, match="must not have"):
        inside(str(root), "../outside/victim")
