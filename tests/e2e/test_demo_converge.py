"""The demo cluster converged by the production deploy, over real SSH, end to end.

The module starts from fresh hosts (``cluster down`` then ``up``) so the first dry run has
something to show; it leaves the cluster up and converged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.e2e.demo import address, chat, cluster, gpu_recipe_data, main_pid, pyinfra

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

ENGINES = {"kimi-h1": "kimi-vllm", "kimi-h2": "kimi-vllm", "kimi-h3": "kimi-sglang", "kimi-h4": "kimi-sglang"}


@pytest.fixture(scope="module")
def fresh_cluster() -> None:
    cluster("down")
    cluster("up", "--hosts", "4")


@pytest.fixture(scope="module")
def pids(fresh_cluster: None) -> dict[str, int]:
    """The first converge, after a dry run that must show changes everywhere; engine PIDs after it."""
    dry = pyinfra("--dry")
    assert dry.code == 0, dry.log[-3000:]
    changed = dry.changed()
    assert changed, dry.log[-3000:]
    for host in ENGINES:
        assert any(host in hosts for hosts in changed.values()), (host, changed)
    first = pyinfra()
    assert first.code == 0, first.log[-4000:]
    assert first.errors() == {}
    return {host: main_pid(host, unit) for host, unit in ENGINES.items()}


def test_dry_run_after_converge_shows_no_change(pids: dict[str, int]) -> None:
    dry = pyinfra("--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert dry.changed() == {}


def test_rerun_changes_nothing_and_keeps_every_engine_process(pids: dict[str, int]) -> None:
    again = pyinfra()
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
    assert {host: main_pid(host, unit) for host, unit in ENGINES.items()} == pids


def test_each_topology_serves_the_model_to_the_controller(pids: dict[str, int]) -> None:
    for url in (f"http://{address('kimi-h1')}:8000", f"http://{address('kimi-h2')}:8000",
                f"http://{address('kimi-h3')}:30000"):  # fmt: skip
        answer = chat(url, "Reply with exactly the word READY and nothing else.")
        choice = answer["choices"][0]
        assert choice["message"]["content"].strip() == "READY", answer
        assert choice["finish_reason"] == "stop"


def test_a_changed_max_model_len_restarts_exactly_the_engines_it_affects(pids: dict[str, int], tmp_path: Path) -> None:
    data = gpu_recipe_data()
    data["topologies"]["demo-vllm"]["max_model_len"] = 131072
    changed_recipe = tmp_path / "demo-131k.yaml"
    changed_recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    try:
        run = pyinfra("--data", f"kimi_recipe={changed_recipe}")
        assert run.code == 0, run.log[-3000:]
        after = {host: main_pid(host, unit) for host, unit in ENGINES.items()}
        assert after["kimi-h1"] != pids["kimi-h1"]
        assert after["kimi-h2"] != pids["kimi-h2"]
        assert after["kimi-h3"] == pids["kimi-h3"]
        assert after["kimi-h4"] == pids["kimi-h4"]
        changed = run.changed()
        # One vLLM instance at a time: kimi-h2 restarts once kimi-h1 answers again.
        assert changed["Services: leaders"] == ["kimi-h1"]
        assert changed["Services: leaders (second batch)"] == ["kimi-h2"]
        assert changed["Rendered units and configs"] == ["kimi-h1"]
        assert changed["Rendered units and configs (second batch)"] == ["kimi-h2"]
        assert "Releases (engine, host tools)" not in changed
    finally:
        back = pyinfra()
        assert back.code == 0, back.log[-3000:]
