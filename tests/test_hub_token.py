"""The controller finds its Hub token where huggingface_hub finds it: checked against the real
client (``get_token``, in a process of its own with each environment), so that the hosts get the
token ``kimi-deploy lock`` used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.weights.hub_token import controller_token

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

CASES = {
    "HF_TOKEN first": ({"HF_TOKEN": " hf_env "}, {"HF_HOME/token": "hf_file"}),
    "the legacy variable": ({"HUGGING_FACE_HUB_TOKEN": "hf_legacy"}, {"HF_HOME/token": "hf_file"}),
    "a blank HF_TOKEN is unset": ({"HF_TOKEN": "  "}, {"HF_HOME/token": "hf_file\n"}),
    "HF_TOKEN_PATH": ({"HF_TOKEN_PATH": "{tmp}/elsewhere/tok"}, {"elsewhere/tok": "hf_path", "HF_HOME/token": "x"}),
    "HF_TOKEN_PATH with ~ and $VAR": ({"HF_TOKEN_PATH": "~/$SUB/tok", "SUB": "d"}, {"home/d/tok": "hf_tilde"}),
    "HF_HOME": ({}, {"HF_HOME/token": "hf_home"}),
    "XDG_CACHE_HOME": ({"XDG_CACHE_HOME": "{tmp}/xdg", "HF_HOME": ""}, {"xdg/huggingface/token": "hf_xdg"}),
    "~/.cache": ({"HF_HOME": ""}, {"home/.cache/huggingface/token": "hf_default"}),
    "none": ({}, {}),
    "an empty file": ({}, {"HF_HOME/token": "\n"}),
}


def _real_client(environ: dict[str, str]) -> str | None:
    code = "from huggingface_hub import get_token; print(get_token() or '')"
    shown = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    return shown.stdout.strip() or None


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_token_is_the_one_huggingface_hub_finds(tmp_path: Path, case: str) -> None:
    variables, files = CASES[case]
    environ = {"HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    environ |= {name: value.replace("{tmp}", str(tmp_path)) for name, value in variables.items()}
    environ = {name: value for name, value in environ.items() if value != "" or name.startswith("HF_TOKEN")}
    for where, text in files.items():
        path = tmp_path / where.replace("HF_HOME", "hf")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    found = controller_token(environ)
    assert found == _real_client(environ)
    assert (found is None) == (case in ("none", "an empty file"))
