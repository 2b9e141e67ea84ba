"""An upgrade restarts independent instances in two batches: kimi-h1's vLLM first, kimi-h2's only
once kimi-h1 answers again; if the first batch fails, the second keeps serving what it served."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.demo import address, chat, demo_recipe, main_pid, pyinfra, ssh, vllm_version

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

NEW = "/opt/kimi/engines/vllm-0.34.1+fastsafetensors-0.5.0"
PROMPT = "Reply with exactly the word READY and nothing else."


@pytest.fixture
def upgrade(demo_cluster: None, tmp_path: Path) -> Iterator[Path]:
    assert pyinfra().code == 0
    recipe = demo_recipe(tmp_path / "demo-0.34.1.yaml", vllm_version("0.34.1"))
    try:
        yield recipe
    finally:
        ssh("kimi-h1", "rm", "-rf", NEW)
        back = pyinfra()
        assert back.code == 0, back.log[-3000:]


def _started(host: str) -> int:
    return int(ssh(host, "systemctl show -p ExecMainStartTimestampMonotonic --value kimi-vllm"))


def test_the_second_instance_restarts_only_after_the_first_answers(upgrade: Path) -> None:
    run = pyinfra("--data", f"kimi_recipe={upgrade}")
    assert run.code == 0, run.log[-3000:]
    changed = run.changed()
    assert changed["Services: leaders"] == ["kimi-h1"]
    assert changed["Smoke test"] == ["kimi-h1"]
    assert changed["Services: leaders (second batch)"] == ["kimi-h2"]
    # The hosts share one kernel, so one monotonic clock: kimi-h2 went down after kimi-h1 was back.
    answered = _started("kimi-h1")
    assert answered < _started("kimi-h2")
    # each engine's time without service, from systemd's stop to its smoke test's answer
    gaps = dict(re.findall(r"\[(kimi-h[12])\] kimi-vllm answers again, (\d+) s after it stopped \(the other", run.log))
    assert set(gaps) == {"kimi-h1", "kimi-h2"}, run.log[-3000:]
    assert all(0 <= int(s) < 600 for s in gaps.values()), gaps


def test_a_failed_first_batch_leaves_the_second_serving_its_release(upgrade: Path) -> None:
    pid = main_pid("kimi-h2", "kimi-vllm")
    # kimi-h1's new release is broken in a way only its start shows: the engine exits at once.
    marker = {
        "package": "vllm",
        "version": "0.34.1",
        "requirements": ["vllm==0.34.1", "fastsafetensors==0.5.0"],
        "index_url": json.loads(ssh("kimi-h1", f"cat {NEW.replace('0.34.1', '0.34.0')}/.kimi-release.json"))[
            "index_url"
        ],
    }
    ssh("kimi-h1", f"mkdir -p {NEW}/bin && printf '#!/bin/sh\\nexit 3\\n' > {NEW}/bin/vllm && chmod +x {NEW}/bin/vllm")
    ssh("kimi-h1", f"cat > {NEW}/.kimi-release.json", stdin=json.dumps(marker).encode())
    run = pyinfra("--data", f"kimi_recipe={upgrade}")
    assert run.code != 0
    assert run.errors()["Smoke test"] == ["kimi-h1"]
    assert "Services: leaders (second batch)" not in run.changed()
    assert main_pid("kimi-h2", "kimi-vllm") == pid
    # Its unit file, its current release and its engine are the ones it served before.
    assert ssh("kimi-h2", "systemctl show -p ExecStart --value kimi-vllm").count("vllm-0.34.0") >= 1
    assert "vllm-0.34.0" in ssh("kimi-h2", "readlink -f /opt/kimi/current/engine")
    assert chat(f"http://{address('kimi-h2')}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY"
