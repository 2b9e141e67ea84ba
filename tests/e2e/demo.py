"""Driving the demo cluster from tests: pyinfra runs, SSH commands, the endpoint from outside."""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.demo_recipes import demo_gpu_data
from harness.own_cluster import BIN, ROOT, Run, run_pyinfra
from harness.ssh import root_ssh
from tests.cluster_env import use_tests_cluster

# The recipe the tests converge the demo cluster with, unless they give another: the demo's hosts
# as if their GPUs were real (vLLM and SGLang releases played by the cluster's stand-ins). The
# real-engine demo recipe, recipes/demo.yaml, has tests of its own (test_demo_real.py).
# The tests' own cluster (tests/cluster_env.py), never the user's demo cluster.
use_tests_cluster()
STATE_DIR = Path(os.environ["KIMI_CLUSTER_DIR"])


def gpu_recipe_data() -> dict[str, Any]:
    """recipes/demo-gpu.yaml, with the API key of the tests' cluster (the demo recipes name the
    demo cluster's)."""
    return demo_gpu_data(STATE_DIR / "api-key")


def drivers_recipe(path: Path, nvidia: dict[str, Any], topology: str, accelerators: dict[str, Any], hosts: int) -> None:
    """The demo recipe at ``path`` with ``drivers.nvidia`` and one topology alone: ``hosts`` of the
    inventory group named like it (``-`` as ``_``), one TP=8 instance over them."""
    data = gpu_recipe_data()
    data["drivers"] = {"nvidia": {k: v for k, v in nvidia.items() if v is not None}}
    group = topology.replace("-", "_")
    data["topologies"] = {
        topology: {
            "engine": "vllm",
            "group": group,
            "accelerators": {"vendor": "nvidia", **accelerators},
            "max_model_len": 32768,
            "pools": {"serve": {"group": group, "role": "serve", "hosts": hosts, "parallel": {"tp": 8}}},
        }
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _written(data: dict[str, Any]) -> str:
    folder = Path(tempfile.mkdtemp(prefix="kimi-e2e-recipe-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "demo-gpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


GPU_RECIPE = _written(gpu_recipe_data())


def state() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((STATE_DIR / "state.json").read_text(encoding="utf-8"))
    return data


# Whether this process started (or found running) the tests' cluster: the session then takes it down.
UP: list[bool] = []


def cluster(*args: str) -> None:
    """``kimi-deploy cluster ARGS`` on the tests' cluster."""
    if args[:1] == ("up",):
        UP.append(True)
    subprocess.run([str(BIN / "kimi-deploy"), "cluster", *args], cwd=ROOT, check=True, timeout=900)


def pyinfra(*args: str, env: dict[str, str] | None = None, deploy: str = "deploys/kimi.py") -> Run:
    """``deploy`` (a converge by default) on the demo inventory, with pyinfra's JSON and its log."""
    recipe = [] if any(a.startswith("kimi_recipe=") for a in args) else ["--data", f"kimi_recipe={GPU_RECIPE}"]
    return run_pyinfra("inventories/demo.py", deploy, [*recipe, *args], env)


def ssh(host: str, *command: str, cluster_state: dict[str, Any] | None = None, stdin: bytes | None = None) -> str:
    """Run ``command`` on ``host`` as root with strict host keys; its stdout, stripped.

    ``cluster_state`` names another cluster's state (default: the demo cluster's).
    """
    st = cluster_state or state()
    address = next(h["address"] for h in st["hosts"] if h["name"] == host)
    out = subprocess.run(
        [*root_ssh(st, address), *command],
        input=stdin,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return out.stdout.decode(errors="replace").strip()


def main_pid(host: str, unit: str) -> int:
    return int(ssh(host, "systemctl", "show", "-p", "MainPID", "--value", f"{unit}.service"))


def address(host: str) -> str:
    return str(next(h["address"] for h in state()["hosts"] if h["name"] == host))


def chat(url: str, prompt: str, key_file: Path | None = None) -> dict[str, Any]:
    """A chat completion from outside the cluster, with the demo's API key (or ``key_file``'s)."""
    return chat_request(url, {"model": "kimi-local", "messages": [{"role": "user", "content": prompt}]}, key_file)


def chat_request(url: str, body: dict[str, Any], key_file: Path | None = None) -> dict[str, Any]:
    """The answer to the chat completion request ``body``, as ``chat`` asks."""
    key = (key_file or STATE_DIR / "api-key").read_text(encoding="utf-8").strip()
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def demo_recipe(path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """The demo recipe with ``edit`` applied, written to ``path`` (for ``--data kimi_recipe=``)."""
    data = gpu_recipe_data()
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def vllm_version(version: str) -> Callable[[dict[str, Any]], None]:
    """An edit of the demo recipe that pins another vLLM release."""

    def edit(data: dict[str, Any]) -> None:
        data["engines"]["vllm"]["version"] = version

    return edit


def install_fabric_manager(st: dict[str, Any], host: str, tmp_path: Path) -> None:
    """A package named and versioned like NVIDIA's fabric manager, one release behind the driver."""
    root = tmp_path / "fm"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN/control").write_text(
        "Package: nvidia-fabricmanager-580\nVersion: 580.82.07-1\nArchitecture: all\n"
        "Maintainer: kimi-deploy tests <tests@localhost>\nDescription: stand-in\n",
        encoding="utf-8",
    )
    subprocess.run(["dpkg-deb", "--build", str(root), str(tmp_path / "fm.deb")], check=True, capture_output=True)
    ssh(
        host,
        "cat > /tmp/fm.deb && dpkg -i /tmp/fm.deb && rm /tmp/fm.deb",
        cluster_state=st,
        stdin=(tmp_path / "fm.deb").read_bytes(),
    )


def host_lines(log: str, marker: str, hosts: Sequence[str]) -> dict[str, list[str]]:
    """For each of ``hosts``, the text after ``marker`` on each of its ``[host] ...`` log lines that has it."""
    out: dict[str, list[str]] = {h: [] for h in hosts}
    for line in log.splitlines():
        found = re.match(r"\s*\[([^\]]+)\]", line)
        if found and found.group(1) in out and marker in line:
            out[found.group(1)].append(line.split(marker, 1)[1].strip())
    return out
