"""Reading secrets on the controller: from an environment variable or a file, never the recipe."""

from __future__ import annotations

import os
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import SecretRef


def read_secret(ref: SecretRef, recipe_file: str, field: str) -> str:
    """The secret's value; ``ConfigError`` naming the field and source when it is not there.

    The value itself never appears in an error.
    """
    if ref.env is not None:
        value = os.environ.get(ref.env, "")
        if not value:
            raise ConfigError(recipe_file, field, f"environment variable {ref.env} is not set on the controller")
        return value
    assert ref.file is not None
    path = Path(ref.file).expanduser()
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(recipe_file, field, f"cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(recipe_file, field, f"{path} is empty")
    return value
