"""Reading secrets on the controller: from an environment variable or a file, never the recipe."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import SecretRef

# Every secret here is an API key sent as ``Authorization: Bearer <key>``: RFC 6750's b64token.
BEARER_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def read_secret(ref: SecretRef, recipe_file: str, field: str, environ: Mapping[str, str]) -> str:
    """The secret's value; ``ConfigError`` naming the field and source when it is not there.

    ``environ`` is the controller's environment. The value itself never appears in an error. It
    must be an RFC 6750 bearer token (letters, digits, ``-._~+/``, then ``=`` padding): what a
    client sends, and what the gateway's nginx configuration and the engines' secret files hold
    without quoting.
    """
    if ref.env is not None:
        value = environ.get(ref.env, "")
        if not value:
            raise ConfigError(recipe_file, field, f"environment variable {ref.env} is not set on the controller")
        return _bearer_token(value, recipe_file, field, f"environment variable {ref.env}")
    assert ref.file is not None
    path = _expand_home(ref.file, environ)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(recipe_file, field, f"cannot read {path}: {exc.strerror}") from None
    if not value:
        raise ConfigError(recipe_file, field, f"{path} is empty")
    return _bearer_token(value, recipe_file, field, str(path))


def _bearer_token(value: str, recipe_file: str, field: str, source: str) -> str:
    match = BEARER_TOKEN.match(value)
    end = match.end() if match else 0
    if end != len(value):
        rule = "an API key is an RFC 6750 bearer token: letters, digits, '-._~+/' then '=' padding"
        raise ConfigError(recipe_file, field, f"{source}: character {end + 1} of {len(value)} breaks the rule ({rule})")
    return value


def _expand_home(path: str, environ: Mapping[str, str]) -> Path:
    """``path`` with a leading ``~`` read as the controller's home directory."""
    if path == "~" or path.startswith("~/"):
        return Path(environ.get("HOME") or Path.home()) / path[2:]
    return Path(path)
