"""The curl ``kimi-deploy status`` prints, pasted into bash: the key goes in a header that the shell
reads from the recipe's file or variable when it runs, never in curl's command line nor in what was
printed. A ``curl`` of the test's own, first on the PATH, records what the real one would be given."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kimi_deploy.plan.endpoints import Endpoint, curl
from kimi_deploy.recipe import SecretRef

# starts a process: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

KEY = "sk-test-0123456789"
ENDPOINT = Endpoint("demo", "h1", "kimi-gateway", "http://10.0.0.1:8000", loopback=False)
# what the stand-in records: its arguments, and the content of each file named after "-H @"
RECORDER = """#!/usr/bin/env python3
import json, sys
args = sys.argv[1:]
headers = [open(args[i + 1][1:]).read() for i, a in enumerate(args[:-1]) if a == "-H" and args[i + 1].startswith("@")]
print(json.dumps({"args": args, "header_files": headers}))
"""


def _run(command: str, tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "curl").write_text(RECORDER, encoding="utf-8")
    (bin_dir / "curl").chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", "-c", command], env={**env, "PATH": path}, capture_output=True, text=True, check=True, timeout=30
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("where", ["file", "env"])
def test_the_key_travels_in_a_header_the_shell_reads_where_the_recipe_says(where: str, tmp_path: Path) -> None:
    folder = tmp_path / "it's a $(folder)"
    folder.mkdir()
    (folder / "api-key").write_text(KEY + "\n", encoding="utf-8")
    key = SecretRef(file=str(folder / "api-key")) if where == "file" else SecretRef(env="KIMI_API_KEY")
    command = curl(ENDPOINT, "kimi-local", 'Say "READY" and it\'s done.', key)
    assert KEY not in command
    got = _run(command, tmp_path, {"KIMI_API_KEY": KEY} if where == "env" else {})
    assert got["header_files"] == [f"Authorization: Bearer {KEY}\n"]
    args = got["args"]
    assert isinstance(args, list)
    assert KEY not in " ".join(args)
    assert args[-1] == "http://10.0.0.1:8000/v1/chat/completions"
    body = json.loads(args[args.index("-d") + 1])
    assert body == {"model": "kimi-local", "messages": [{"role": "user", "content": 'Say "READY" and it\'s done.'}]}


def test_a_topology_without_a_key_sends_none(tmp_path: Path) -> None:
    got = _run(curl(ENDPOINT, "kimi-local", "hi", None), tmp_path, {})
    assert got["header_files"] == []
    assert "Authorization" not in " ".join(got["args"])  # type: ignore[arg-type]
