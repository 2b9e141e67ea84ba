"""Bad input on the demo cluster: one clear line naming the host and the cause, and the release
that was serving keeps serving (no engine restarted)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.hub_access import gated_line
from localcluster.hub import write_faults
from tests.e2e.demo import STATE_DIR, address, chat, demo_recipe, main_pid, pyinfra, ssh, state

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

ENGINES = {"kimi-h1": "kimi-vllm", "kimi-h2": "kimi-vllm", "kimi-h3": "kimi-sglang", "kimi-h4": "kimi-sglang"}
REVISION_B = "1088b4b0a968514a4de7da23014f7058bbfbd30c"


@pytest.fixture
def serving(demo_cluster: None) -> dict[str, int]:
    """A converged demo cluster (a no-op when it already is) and its engine PIDs before the test."""
    run = pyinfra()
    assert run.code == 0, run.log[-3000:]
    return {host: main_pid(host, unit) for host, unit in ENGINES.items()}


def _still_serving(before: dict[str, int]) -> None:
    assert {host: main_pid(host, unit) for host, unit in ENGINES.items()} == before
    answer = chat(f"http://{address('kimi-h1')}:8000", "Reply with exactly the word READY and nothing else.")
    assert answer["choices"][0]["message"]["content"] == "READY"


def _lines(log: str, needle: str) -> list[str]:
    return [line.strip() for line in log.splitlines() if needle in line]


@pytest.fixture
def hub_down() -> Iterator[None]:
    # Down with Retry-After 1, which the hosts honour: their few tries take seconds, not a minute.
    write_faults(STATE_DIR / "hub", {"down": True, "retry_after": 1})
    try:
        yield
    finally:
        write_faults(STATE_DIR / "hub", None)


def test_unreachable_hub(serving: dict[str, int], tmp_path: Path, hub_down: None) -> None:
    def to_revision_b(data: dict[str, Any]) -> None:
        data["model"]["revision"] = REVISION_B

    for host in ENGINES:  # revision B must have to come from the Hub
        ssh(host, "rm", "-rf", f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION_B}")
    run = pyinfra("--data", f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', to_revision_b)}")
    assert run.code != 0
    hub = state()["services"]["hub"]["url"]
    for host in ENGINES:
        (line,) = _lines(run.log, f"[{host}] kimi-deploy: weights")
        assert f"moonshotai/Kimi-K3.1-Pro-Tiny@{REVISION_B[:12]}: {hub}: " in line
        assert "503" in line
    assert "Retrying" not in run.log
    _still_serving(serving)


def test_a_gated_repository_fails_in_one_line_and_a_granted_token_proceeds(
    serving: dict[str, int], tmp_path: Path
) -> None:
    """The Hub gates the model's files (its listing stays open, so the lock passes): without a token
    every host says so in one line and nothing restarts; with a token the account was granted, the
    same converge proceeds."""
    repo, granted = "moonshotai/Kimi-K3.1-Pro-Tiny", "hf_granted_7c1e0d2b9a"

    def to_revision_b(data: dict[str, Any]) -> None:
        data["model"]["revision"] = REVISION_B

    for host in ENGINES:  # revision B must have to come from the Hub
        ssh(host, "rm", "-rf", f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION_B}")
    recipe = f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', to_revision_b)}"
    hub = state()["services"]["hub"]["url"]
    write_faults(STATE_DIR / "hub", {"gated": {repo: [granted]}})
    try:
        run = pyinfra("--data", recipe, env={"HF_TOKEN": ""})
        assert run.code != 0
        for host in ENGINES:
            assert _lines(run.log, f"[{host}] kimi-deploy: weights") == [
                f"[{host}] kimi-deploy: weights {repo}@{REVISION_B[:12]}: {hub}: {gated_line(repo, hub, 401)}"
            ]
        _still_serving(serving)
        run = pyinfra("--data", recipe, env={"HF_TOKEN": granted})
        assert run.code == 0, run.log[-3000:]
    finally:
        write_faults(STATE_DIR / "hub", None)
        # Leave the hosts as the other tests expect them: serving revision A, holding no revision B.
        back = pyinfra()
        for host in ENGINES:
            ssh(host, "rm", "-rf", f"/srv/models/moonshotai--Kimi-K3.1-Pro-Tiny/{REVISION_B}")
    assert back.code == 0, back.log[-3000:]


def test_pinned_version_missing_from_the_index(serving: dict[str, int], tmp_path: Path) -> None:
    def missing_pin(data: dict[str, Any]) -> None:
        data["engines"]["vllm"]["packages"]["fastsafetensors"] = "0.5.1"

    run = pyinfra("--data", f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', missing_pin)}")
    assert run.code != 0
    for host in ("kimi-h1", "kimi-h2"):
        (line,) = _lines(run.log, f"[{host}] kimi-deploy:")
        index = state()["services"]["index"]["url"]
        assert line.endswith(f"fastsafetensors==0.5.1 is not on {index} (available: 0.5.0)")
    # The half-made release is gone; the running one is untouched.
    assert "vllm-0.34.0+fastsafetensors-0.5.1" not in ssh("kimi-h1", "ls", "/opt/kimi/engines").split()
    _still_serving(serving)


def test_port_already_in_use_on_a_host(serving: dict[str, int], tmp_path: Path) -> None:
    def api_on_8001(data: dict[str, Any]) -> None:
        data["topologies"]["demo-vllm"]["ports"] = {"api": 8001}

    ssh("kimi-h2", "systemd-run", "--unit=squatter", "python3", "-m", "http.server", "8001")
    try:
        # ssh hands the remote shell one string: wait until the squatter listens.
        ssh("kimi-h2", "for i in $(seq 50); do ss -ltn | grep -q ':8001 ' && exit 0; sleep 0.1; done; exit 1")
        run = pyinfra("--data", f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', api_on_8001)}")
    finally:
        ssh("kimi-h2", "systemctl", "stop", "squatter.service")
    assert run.code != 0
    (line,) = _lines(run.log, "pyinfra error")
    # the topology's API port is its gateway's (the engine listens on loopback behind it)
    assert "kimi-h2: port 8001 (kimi-gateway api) is in use by pid " in line
    assert line.endswith("(python3, unit squatter)")
    assert "Starting operation" not in run.log
    _still_serving(serving)


def test_an_engine_not_ready_in_time_fails_the_deploy_with_its_journal(serving: dict[str, int], tmp_path: Path) -> None:
    def slow_start(data: dict[str, Any]) -> None:
        # The stand-in engine takes this long to load; the recipe gives it less than that.
        data["topologies"]["demo-vllm"]["env"]["KIMI_STANDIN_LOAD_SECONDS"] = "30"
        data["smoke"]["timeout_s"] = 2

    try:
        run = pyinfra(
            "--data", f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', slow_start)}", "--limit", "kimi-h1"
        )
        assert run.code != 0
        (line,) = _lines(run.log, "[kimi-h1] kimi-deploy: kimi-vllm: not ready after 2 s")
        assert line.endswith("journal tail:")
        assert _lines(run.log, "[kimi-h1]     ")  # the journal lines follow
    finally:
        back = pyinfra()
        assert back.code == 0, back.log[-3000:]


def test_a_failed_preflight_gate_stops_that_host_before_any_change(serving: dict[str, int], tmp_path: Path) -> None:
    def wants_h200(data: dict[str, Any]) -> None:
        data["topologies"]["demo-vllm"]["accelerators"] = {
            "vendor": "nvidia",
            "model": "H200",
            "per_host": 8,
            "memory_gib": 140,
        }
        data["topologies"]["demo-vllm"]["max_model_len"] = 131072

    before = {host: ssh(host, "readlink", "/opt/kimi/current") for host in ENGINES}
    run = pyinfra("--data", f"kimi_recipe={demo_recipe(tmp_path / 'recipe.yaml', wants_h200)}")
    assert run.code != 0
    for host in ("kimi-h1", "kimi-h2"):
        (line,) = _lines(run.log, f"[{host}] kimi-deploy: preflight:")
        assert line.endswith(
            f"{host}: accelerators: pool serve needs 8 x H200 with >= 140 GiB, found 8 x NVIDIA B300 SXM6 AC (268 GiB)"
        )
    # Nothing changed on the stopped hosts (same release, same engine); the others went on.
    assert {host: ssh(host, "readlink", "/opt/kimi/current") for host in ENGINES} == before
    assert run.errors()["Preflight"] == ["kimi-h1", "kimi-h2"]
    assert not [op for op, hosts in run.changed().items() if {"kimi-h1", "kimi-h2"} & set(hosts)]
    _still_serving(serving)
