"""The local cluster for end-to-end tests: brought up once per session, reused when already running.

Tests read the cluster the way other tools do, from ``state.json``, and reach hosts over real SSH.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from localcluster.state import Settings

ROOT = Path(__file__).resolve().parents[2]
HOSTS = 4
# Shown at the end of the run: how long the cluster took to come up and go away.
TIMINGS: dict[str, float] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "localcluster: end-to-end test on the local cluster (needs root)")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("local cluster timings")
        for what, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{what:<44} {seconds:6.1f} s")


def why_not_here() -> str | None:
    """Why this machine cannot run a local cluster, or None when it can."""
    if sys.platform != "linux":
        return "the local cluster needs Linux"
    if os.geteuid() != 0:
        return "the local cluster needs root (network namespaces, overlay mounts, cgroups)"
    if shutil.which("systemd-nspawn") is None and shutil.which("apt-get") is None:
        return "no systemd-nspawn and no apt-get to install it"
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.decode(errors='replace').strip()}"
    return None


def cluster_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """``python -m localcluster ARGS`` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "localcluster", *args],
        cwd=ROOT,
        env=dict(os.environ if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def checked(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@dataclasses.dataclass
class Cluster:
    """A running cluster as ``state.json`` describes it."""

    settings: Settings
    env: dict[str, str]

    @property
    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.settings.state_file.read_text(encoding="utf-8"))
        return data

    def host(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = [h for h in self.state["hosts"] if h["name"] == name]
        assert found, f"no host {name} in {self.settings.state_file}"
        return found[0]

    def ssh_argv(self, name: str, command: str, known_hosts: str | None = None) -> list[str]:
        state = self.state
        return [
            "ssh",
            "-i",
            state["ssh_key"],
            "-o",
            f"UserKnownHostsFile={known_hosts or state['known_hosts']}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{self.host(name)['address']}",
            command,
        ]

    def ssh(self, name: str, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.ssh_argv(name, command), capture_output=True, text=True, timeout=60, check=False)
        if check:
            checked(proc)
        return proc


def _base_cached(settings: Settings) -> bool:
    return any(settings.cache_dir.glob("base-*.recipe.json"))


def _runs_as_wanted(cluster: Cluster) -> bool:
    if cluster_cli("status", env=cluster.env).returncode != 0:
        return False
    hosts = cluster.state["hosts"]
    return len(hosts) == HOSTS and all(cluster.ssh(h["name"], "true", check=False).returncode == 0 for h in hosts)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The default cluster (4 hosts); left running afterwards only if it was running before."""
    reason = why_not_here()
    if reason is not None:
        pytest.skip(reason)
    env = dict(os.environ)
    found = Cluster(Settings.from_env(env), env)
    was_running = found.settings.state_file.exists() and _runs_as_wanted(found)
    if was_running:
        what = "up, 4 hosts already running"
    elif _base_cached(found.settings):
        what = "up, 4 hosts (base image cached)"
    else:
        what = "up, 4 hosts, from nothing"
    # Also when it runs: `up` completes whatever part is missing (a service, say) and is quick.
    started = time.monotonic()
    checked(cluster_cli("up", "--hosts", str(HOSTS), env=env))
    TIMINGS[what] = time.monotonic() - started
    yield found
    if not was_running:
        started = time.monotonic()
        checked(cluster_cli("down", env=env))
        TIMINGS["down, 4 hosts"] = time.monotonic() - started
