"""API keys read on the controller: RFC 6750 bearer tokens, refused in one line that never shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_deploy.errors import ConfigError
from kimi_deploy.recipe import SecretRef
from kimi_deploy.secrets import read_secret

FIELD = "topologies.pd.expose.api_key"


def test_a_bearer_token_is_read_from_a_file_or_the_environment(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-Abc_123.~+/xyz==\n", encoding="utf-8")
    assert read_secret(SecretRef(file=str(key)), "recipe.yaml", FIELD, {}) == "sk-Abc_123.~+/xyz=="
    environ = {"KIMI_TEST_KEY": "sk-from-env"}
    assert read_secret(SecretRef(env="KIMI_TEST_KEY"), "recipe.yaml", FIELD, environ) == "sk-from-env"
    # a file under the controller's home, as the environment passed in names it
    assert read_secret(SecretRef(file="~/key"), "recipe.yaml", FIELD, {"HOME": str(tmp_path)}) == "sk-Abc_123.~+/xyz=="


@pytest.mark.parametrize(
    ("value", "position"),
    [('sk-"quoted"', 4), ("sk-a b", 5), ("sk-$var", 4), ("sk-a;b", 5), ("sk-a=b", 6), ("sk-\u00e9", 4)],
)
def test_a_key_that_is_not_a_bearer_token_is_refused_without_showing_it(value: str, position: int) -> None:
    with pytest.raises(ConfigError) as refused:
        read_secret(SecretRef(env="KIMI_TEST_KEY"), "recipe.yaml", FIELD, {"KIMI_TEST_KEY": value})
    message = str(refused.value)
    assert message.startswith(f"recipe.yaml: {FIELD}: environment variable KIMI_TEST_KEY: character {position} of")
    assert "RFC 6750" in message
    assert value not in message
