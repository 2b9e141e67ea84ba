"""The README's quick start, typed as written, from a fresh virtual environment holding only the
wheel, against hosts used as a user's own: ``init``, a lock made from the cluster's Hub,
``validate``, a dry run with its diff, the converge as an unprivileged SSH user with sudo, and
``status``, whose curl answers.

The block runs in bash as it stands in README.md (``<!-- quick-start -->``), with two things a user
brings: the package (``pip install kimi-deploy`` is the wheel built from this checkout; the README
names that form too) and an editor (``$EDITOR`` is a program that writes the user's inventory,
the cluster's two hosts reached as ``ops`` with ``_sudo``, and recipe, the demo's vLLM topology on
them). ``HF_ENDPOINT`` names the cluster's Hub, as a user names a mirror.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from harness.demo_recipes import demo_gpu_data
from harness.own_cluster import ROOT, OwnCluster

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the cluster needs root and iproute2"
)

CLUSTER = OwnCluster({"KIMI_CLUSTER_DIR": "/var/lib/kimi-cluster-quickstart", "KIMI_CLUSTER_SUBNET": "10.213.23.0/24"})
# the cluster's unprivileged operator (lab/localcluster/operator_user.py)
OPERATOR = "ops"

EDITOR = """\
#!{python}
# The user's edits: the hosts of their inventory and the pins of their recipe.
import sys
from pathlib import Path
inventory, recipe = sys.argv[1:3]
Path(inventory).write_text({inventory_text!r}, encoding="utf-8")
Path(recipe).write_text({recipe_text!r}, encoding="utf-8")
"""


def quick_start() -> str:
    """The README's quick-start block, as written."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- quick-start -->\n```sh\n(.*?)```", text, re.S)
    assert match, "README.md has no quick-start block"
    return match.group(1)


def first_curl(said: str) -> str:
    """The first curl ``status`` printed, with its continued lines."""
    lines = said.splitlines()
    (start, *_) = [i for i, line in enumerate(lines) if line.lstrip().startswith("curl ")]
    command = []
    for line in lines[start:]:
        command.append(line.strip())
        if not line.rstrip().endswith("\\"):
            break
    return "\n".join(command)


def _inventory(state: dict[str, Any]) -> str:
    common = {
        "ssh_user": OPERATOR,
        "_sudo": True,
        "ssh_key": state["ssh_key"],
        "ssh_known_hosts_file": state["known_hosts"],
        "ssh_strict_host_key_checking": "yes",
        "kimi_pip_index_url": state["services"]["index"]["url"],
        "kimi_hf_endpoint": state["services"]["hub"]["url"],
        "kimi_nvidia_repo_url": state["services"]["apt"]["url"],
    }
    hosts = [(h["name"], {"ssh_hostname": h["address"], **common}) for h in state["hosts"]]
    return f'"""My two hosts."""\n\ndemo_vllm = {hosts!r}\n'


def _recipe() -> str:
    data = demo_gpu_data(CLUSTER.dir / "api-key")
    data["topologies"] = {"demo-vllm": data["topologies"]["demo-vllm"]}
    return yaml.safe_dump(data, sort_keys=False)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("quick-start")
    dist = folder / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(dist)], check=True, timeout=300
    )
    (wheel,) = dist.glob("kimi_deploy-*.whl")
    with CLUSTER.fresh("b300x8", folder, hosts=2) as state:
        yield {"dir": folder, "wheel": wheel, "state": state}


def test_the_readmes_quick_start_reaches_a_converge_as_a_sudo_user_and_an_answer(home: dict[str, Any]) -> None:
    folder, state = home["dir"], home["state"]
    editor = folder / "editor"
    editor.write_text(
        EDITOR.format(python=sys.executable, inventory_text=_inventory(state), recipe_text=_recipe()), encoding="utf-8"
    )
    editor.chmod(0o755)
    block = quick_start()
    # the package: this checkout's wheel (the README's own alternative to the index)
    lines = block.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("pip install kimi-deploy")]
    lines[at] = f"pip install -q {home['wheel']}"
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    user_home = folder / "home"
    user_home.mkdir()
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(user_home),
        "EDITOR": str(editor),
        "HF_ENDPOINT": state["services"]["hub"]["url"],
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "LANG": "C.UTF-8",
    }
    # pip's own settings of this machine (its index, find-links), as the user's pip has its own
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    run = subprocess.run(
        ["bash", "-c", script], cwd=user_home, env=env, capture_output=True, text=True, timeout=1500, check=False
    )
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-6000:]
    site = user_home / "mysite"
    # the lock made from the cluster's Hub, beside the recipe
    assert list((site / "recipes" / "locks").glob("kimi-deploy--tiny-llama@*.json"))
    assert "ok: recipes/kimi-k3.1-pro.yaml x inventories/prod.py: 2 hosts in demo-vllm" in run.stdout
    # status printed a curl that answers, its key read from the file the recipe names, never shown
    curl = first_curl(run.stdout)
    assert "api-key" in curl, said[-4000:]
    assert (CLUSTER.dir / "api-key").read_text(encoding="utf-8").strip() not in said
    asked = subprocess.run(
        ["bash", "-c", curl.replace("curl ", "curl --fail --max-time 60 ", 1)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert asked.returncode == 0, asked.stderr
    assert "READY" in asked.stdout
    # the converge's commands ran through sudo as the operator (sudo's own log on a host)
    sudo_log = subprocess.run(
        [
            "ssh",
            "-i",
            state["ssh_key"],
            "-o",
            f"UserKnownHostsFile={state['known_hosts']}",
            "-o",
            "StrictHostKeyChecking=yes",
            f"{OPERATOR}@{state['hosts'][0]['address']}",
            "sudo -n journalctl -t sudo --no-pager -o cat",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    ran = [line for line in sudo_log.splitlines() if line.lstrip().startswith(f"{OPERATOR} :")]
    assert any("systemctl" in line or "sh -c" in line for line in ran), sudo_log[-3000:]
