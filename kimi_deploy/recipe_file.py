"""Reading a recipe file: the schema (``kimi_deploy.recipe``) checked against the registered
engines and accelerator kinds, whose rules it asks by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kimi_deploy.accelerators import KINDS
from kimi_deploy.engines import ENGINES
from kimi_deploy.recipe import Recipe, Rules
from kimi_deploy.validation_error import first_error_line
from kimi_deploy.yaml_file import read_yaml_mapping

RULES = Rules(vendors=KINDS, engines=ENGINES)


def recipe_from(data: Any) -> Recipe:
    """A recipe from its parsed YAML (pydantic's ``ValidationError`` on a fault)."""
    return Recipe.model_validate(data, context=RULES)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; raise ``ConfigError`` (one line) on any fault."""
    data = read_yaml_mapping(path)
    try:
        return recipe_from(data)
    except ValueError as exc:
        raise first_error_line(str(path), exc, Recipe) from None
