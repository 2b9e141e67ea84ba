"""A cluster of one's own (``kimi-deploy cluster`` with its own state folder and subnet), and a
pyinfra run against it read back as its JSON and log: for the end-to-end tests and the benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.ssh import root_ssh

# the checkout this lab is part of (lab/harness/own_cluster.py): its recipes, inventories, deploys
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def in_deploy(name: str) -> str:
    """An operation's name as its deploy names it: pyinfra puts the ``@deploy``'s name before it
    (``kimi | Preflight`` -> ``Preflight``; ``kimi | drivers | NVIDIA services`` -> ``drivers |
    NVIDIA services``)."""
    return name.split(" | ", 1)[1] if " | " in name else name


@dataclass(frozen=True)
class Run:
    code: int
    payload: dict[str, Any] | None
    log: str

    def changed(self) -> dict[str, list[str]]:
        """Operation name (``in_deploy``) -> hosts where it changed (or, in a dry run, would change)."""
        assert self.payload is not None, self.log[-3000:]
        if self.payload.get("results") is None:
            plan = self.payload["plan"]
            return {in_deploy(op["name"]): op["hosts_with_change"] for op in plan if op["hosts_with_change"]}
        ops = self.payload["results"]["operations"] if isinstance(self.payload["results"], dict) else []
        return {in_deploy(op["name"]): op["success"] for op in ops if op["success"]}

    def errors(self) -> dict[str, list[str]]:
        """Operation name (``in_deploy``) -> hosts where it failed."""
        assert self.payload is not None, self.log[-3000:]
        assert self.payload.get("results") is not None, self.log[-3000:]
        return {in_deploy(op["name"]): op["error"] for op in self.payload["results"]["operations"] if op["error"]}


# The head of an inventory for a cluster of a test's own: every host with the cluster's SSH key,
# package index, Hub and apt repository; the test appends its groups of ``_hosts``.
OWN_INVENTORY = """
import json
_state = json.load(open({state!r}))
_common = {{"ssh_user": "root", "ssh_key": _state["ssh_key"], "ssh_known_hosts_file": _state["known_hosts"],
           "ssh_strict_host_key_checking": "yes", "kimi_recipe": {recipe!r},
           "kimi_pip_index_url": _state["services"]["index"]["url"],
           "kimi_hf_endpoint": _state["services"]["hub"]["url"],
           "kimi_nvidia_repo_url": _state["services"]["apt"]["url"], "kimi_drill_faults": _state["drill_faults"]}}
_hosts = [(h["name"], {{"ssh_hostname": h["address"], **_common}}) for h in _state["hosts"]]
"""


@dataclass(frozen=True)
class OwnCluster:
    """A cluster of a test module's own: its state directory and ``kimi-deploy cluster`` environment."""

    env: dict[str, str]

    @property
    def dir(self) -> Path:
        return Path(self.env["KIMI_CLUSTER_DIR"])

    def cli(self, *args: str) -> None:
        subprocess.run(
            [str(BIN / "kimi-deploy"), "cluster", *args],
            cwd=ROOT,
            check=True,
            timeout=900,
            env={**os.environ, **self.env},
        )

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dir / "state.json").read_text(encoding="utf-8"))
        return data

    @contextlib.contextmanager
    def fresh(self, hardware: str, folder: Path, hosts: int | None = None) -> Iterator[dict[str, Any]]:
        """Fresh hosts of ``hardware`` (nothing left of an earlier run; ``hosts`` of them, else the
        cluster's default number), their state with ``"dir": folder``; down again at the end,
        whatever happened."""
        self.cli("down")
        # the services' fault files outlive a down (an earlier run that stopped half-way left them)
        for service in ("hub", "index"):
            (self.dir / service / "faults.json").unlink(missing_ok=True)
        self.cli("up", "--hardware", hardware, *(["--hosts", str(hosts)] if hosts else []))
        try:
            yield {**self.state(), "dir": folder}
        finally:
            self.cli("down")

    def inventory(self, path: Path, recipe: Path, groups: str) -> Path:
        """An inventory at ``path`` of this cluster's hosts with ``recipe``; ``groups`` is Python
        that names groups from ``_hosts`` (a list of (name, data))."""
        head = OWN_INVENTORY.format(state=str(self.dir / "state.json"), recipe=str(recipe))
        path.write_text(head + groups.strip() + "\n", encoding="utf-8")
        return path

    def pyinfra(self, inventory: Path, *args: str, deploy: str = "deploys/kimi.py") -> Run:
        return run_pyinfra(str(inventory), deploy, list(args), self.env)


def run_pyinfra(inventory: str, deploy: str, args: list[str], env: dict[str, str] | None = None) -> Run:
    """``pyinfra INVENTORY DEPLOY`` from the checkout, with ``env`` added: its JSON and its log."""
    # a dry run must not get -y: pyinfra only works out what would change when it may prompt
    yes = [] if "--dry" in args else ["-y"]
    proc = subprocess.run(
        [str(BIN / "pyinfra"), inventory, deploy, *yes, "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={**os.environ, **(env or {})},
    )
    try:
        payload = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    except ValueError:
        payload = None
    return Run(proc.returncode, payload, proc.stdout + proc.stderr)


def host_ssh(state: dict[str, Any], host: dict[str, Any], command: str) -> None:
    """Run ``command`` as root on ``host`` of the cluster whose ``state`` is given, keys checked."""
    subprocess.run(
        [*root_ssh(state, host["address"]), command],
        check=True,
        capture_output=True,
        timeout=60,
    )


def hub_json(state: dict[str, Any], path: str, method: str = "GET") -> dict[str, Any]:
    """The answer of the cluster's Hub to ``path`` (``/_stats``, ``/_stats/reset``)."""
    url = state["services"]["hub"]["url"] + path
    request = urllib.request.Request(url, method=method)  # noqa: S310 - the cluster's own http:// Hub
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
        data: dict[str, Any] = json.loads(answer.read() or b"{}")
        return data
