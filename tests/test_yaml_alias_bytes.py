"""A YAML file whose aliases repeat a large value (kimi_deploy/yaml_file.py): refused in one line
naming the file and the rule, before anything walks the values, by the loader and by the CLI.

Few values, many bytes: one 1 MiB string aliased 16 times is 17 values, under any count of values,
yet 16 MiB that every later step (the schema, the plan, the render) would walk and copy; 2,000
aliases of a 2 MiB string made ``validate`` take 17 s and ``plan --render`` die of a MemoryError.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.yaml_file import read_yaml_mapping
from tests.cli_run import kimi
from tests.conftest import PROD, RECIPE, ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

RECIPE_TEXT = (ROOT / RECIPE).read_text(encoding="utf-8")
MIB = 1 << 20
RULE = "YAML aliases repeat more than 8388608 bytes of values (an alias bomb?)"


def _repeated(size: int, times: int) -> str:
    """A top-level key holding a string of ``size`` bytes and ``times`` aliases of it."""
    return f"repeated:\n  value: &big '{'x' * size}'\n  again: [{', '.join(['*big'] * times)}]\n"


def test_aliases_repeating_a_large_string_are_refused_by_their_bytes(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(_repeated(MIB, 16), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_yaml_mapping(path)
    assert str(info.value) == f"{path}: {RULE}"


def test_aliases_nested_in_aliases_count_every_copy(tmp_path: Path) -> None:
    """Each level repeats the one below four times: 64 KiB becomes 16 MiB in four levels."""
    path = tmp_path / "recipe.yaml"
    levels = [f"  l0: &l0 '{'x' * (64 << 10)}'"]
    levels += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 4)}]" for i in range(1, 5)]
    path.write_text("nested:\n" + "\n".join(levels) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_yaml_mapping(path)
    assert str(info.value) == f"{path}: {RULE}"


def test_a_large_value_written_out_or_aliased_a_few_times_is_read(tmp_path: Path) -> None:
    """The bound is on what aliases repeat, not on what the file holds: a long prompt written
    out is the file's own size, and aliased a few times it stays well under the bound."""
    path = tmp_path / "recipe.yaml"
    path.write_text(f"long: '{'x' * (12 * MIB)}'\n" + _repeated(MIB, 4), encoding="utf-8")
    data = read_yaml_mapping(path)
    assert len(data["long"]) == 12 * MIB
    assert data["repeated"]["again"] == [data["repeated"]["value"]] * 4


def test_validate_and_plan_refuse_a_recipe_whose_aliases_repeat_a_large_string(tmp_path: Path) -> None:
    """The aliases sit where the schema takes any value (a task's JSON Schema's ``examples``):
    without the bound the recipe is valid, and ``plan --render`` copies every alias."""
    recipe = tmp_path / "recipe.yaml"
    schema = "          required: [name, year]\n"
    examples = f"          examples: [&big '{'x' * 2 * MIB}', {', '.join(['*big'] * 63)}]\n"
    assert schema in RECIPE_TEXT
    recipe.write_text(RECIPE_TEXT.replace(schema, schema + examples), encoding="utf-8")
    for command in (("validate", str(recipe), PROD), ("plan", str(recipe), PROD, "--render", str(tmp_path / "out"))):
        run = kimi(*command)
        assert (run.returncode, run.stdout, run.stderr) == (2, "", f"{recipe}: {RULE}\n"), command
