"""Upgrade by a pin change, then roll back: the hosts the upgrade changed go back to the release
they served before, installing and downloading nothing; a rollback target no longer whole on a
host is named in one line, and that host keeps serving what it serves."""

from __future__ import annotations

import json
import os
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.demo import address, chat, demo_recipe, main_pid, pyinfra, ssh, state, vllm_version

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

VLLM_HOSTS = ("kimi-h1", "kimi-h2")
PROMPT = "Reply with exactly the word READY and nothing else."


def _get(url: str, method: str = "GET") -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as answer:
        data: dict[str, Any] = json.loads(answer.read() or b"{}")
        return data


def _engine(host: str) -> str:
    return ssh(host, "systemctl show -p ExecStart --value kimi-vllm").split("path=")[1].split()[0]


def _rollback() -> tuple[int, str]:
    run = pyinfra(deploy="deploys/rollback.py")
    return run.code, run.log


@pytest.fixture
def upgraded(demo_cluster: None, tmp_path: Path) -> Iterator[None]:
    assert pyinfra().code == 0
    recipe = demo_recipe(tmp_path / "demo-0.34.1.yaml", vllm_version("0.34.1"))
    run = pyinfra("--data", f"kimi_recipe={recipe}")
    assert run.code == 0, run.log[-3000:]
    assert run.changed()["Services: leaders"] == ["kimi-h1"]
    assert run.changed()["Services: leaders (second batch)"] == ["kimi-h2"]
    assert {_engine(h) for h in VLLM_HOSTS} == {"/opt/kimi/engines/vllm-0.34.1+fastsafetensors-0.5.0/bin/vllm"}
    try:
        yield
    finally:
        back = pyinfra()  # the demo recipe's pins again, whatever the test left
        assert back.code == 0, back.log[-3000:]


def test_rollback_returns_the_upgraded_hosts_without_installing_or_downloading(upgraded: None) -> None:
    services = state()["services"]
    _get(services["hub"]["url"] + "/_stats/reset", "POST")
    index_before = _get(services["index"]["url"].rsplit("/simple", 1)[0] + "/_stats")["requests_total"]
    code, log = _rollback()
    assert code == 0, log[-3000:]
    assert {_engine(h) for h in VLLM_HOSTS} == {"/opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0/bin/vllm"}
    for host in VLLM_HOSTS:
        assert chat(f"http://{address(host)}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY"
        assert (
            f"{host}: back to vllm 0.34.0, weights 23eb01d77aab; to keep it, set in the recipe: "
            "engines.vllm.packages.fastsafetensors: 0.5.0, engines.vllm.version: 0.34.0, "
            "model.revision: 23eb01d77aab1f1b9ff6dda80033b783970fe79c"
        ) in log
    for host in ("kimi-h3", "kimi-h4"):
        assert f"{host}: the latest converge did not change this host's release" in log
    assert {k: v for k, v in _get(services["hub"]["url"] + "/_stats")["bytes"].items() if v} == {}
    assert _get(services["index"]["url"].rsplit("/simple", 1)[0] + "/_stats")["requests_total"] == index_before
    assert ssh("kimi-h1", "tail -n 2 /var/lib/kimi/releases.log | awk '{print $3}' | paste -sd ' '") == (
        "rolled-back serving"
    )
    # The demo recipe pins what the hosts run again: a converge has nothing to do, nor a second rollback.
    assert pyinfra().changed() == {}
    code, log = _rollback()
    assert code == 0
    assert "back to" not in log


def test_a_rollback_target_no_longer_on_a_host_is_named_and_that_host_keeps_serving(upgraded: None) -> None:
    ssh("kimi-h1", "rm -rf /opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0")
    code, log = _rollback()
    assert code != 0
    (line,) = [x.strip() for x in log.splitlines() if "[kimi-h1] kimi-deploy: rollback:" in x]
    assert line.endswith("(vllm 0.34.0, weights 23eb01d77aab): its engine release is gone"), line
    assert "kimi-h1: rollback target /opt/kimi/releases/" in line
    assert _engine("kimi-h1").startswith("/opt/kimi/engines/vllm-0.34.1")
    assert chat(f"http://{address('kimi-h1')}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY"
    # kimi-h2 is the second batch: it goes back only once the first has; it keeps serving too.
    assert _engine("kimi-h2").startswith("/opt/kimi/engines/vllm-0.34.1")
    assert chat(f"http://{address('kimi-h2')}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY"


def test_a_unit_that_kept_running_is_left_running_by_the_rollback_and_the_converge_after(
    demo_cluster: None, tmp_path: Path
) -> None:
    """The gateways in front of the vLLM engines keep running through an engine-only change (a
    release whose copies of their files they were not restarted for), an upgrade, and the rollback
    to that release: neither the rollback nor the converge after it restarts them."""

    def longer(data: dict[str, Any]) -> None:
        data["topologies"]["demo-vllm"]["max_model_len"] = 131072

    def upgraded(data: dict[str, Any]) -> None:
        longer(data)
        vllm_version("0.34.1")(data)

    assert pyinfra().code == 0
    gateways = {host: main_pid(host, "kimi-gateway") for host in VLLM_HOSTS}
    before = demo_recipe(tmp_path / "longer.yaml", longer)
    try:
        for recipe in (before, demo_recipe(tmp_path / "upgraded.yaml", upgraded)):
            run = pyinfra("--data", f"kimi_recipe={recipe}")
            assert run.code == 0, run.log[-3000:]
        code, log = _rollback()
        assert code == 0, log[-3000:]
        after = pyinfra("--data", f"kimi_recipe={before}")
        assert after.code == 0, after.log[-3000:]
        assert after.changed() == {}
        assert {host: main_pid(host, "kimi-gateway") for host in VLLM_HOSTS} == gateways
    finally:
        back = pyinfra()
        assert back.code == 0, back.log[-3000:]


def test_converging_back_to_the_earlier_pins_needs_neither_the_hub_nor_the_index(upgraded: None) -> None:
    """Back to the demo recipe's pins with the Hub and the package index out of reach (both at a
    port nothing listens on, on each host's own loopback): the earlier release and the rollback
    copy of the weights are on the hosts, and that is all the converge uses."""
    closed = "http://127.0.0.1:9"
    run = pyinfra("--data", f"kimi_hf_endpoint={closed}", "--data", f"kimi_pip_index_url={closed}/simple")
    assert run.code == 0, run.log[-4000:]
    assert {_engine(h) for h in VLLM_HOSTS} == {"/opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0/bin/vllm"}
    assert "Releases (engine, host tools)" not in run.changed()
    for host in VLLM_HOSTS:
        assert chat(f"http://{address(host)}:8000", PROMPT)["choices"][0]["message"]["content"] == "READY"
