"""The hardware probe over real SSH on the running local cluster: one round-trip per host.

Read-only towards the cluster: it neither starts nor stops it, and changes nothing on the hosts
(the measured read writes a 64 MiB file under /srv/models and removes it in the same call).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from harness.ssh import root_ssh
from kimi_deploy.host.command import hostside_command
from kimi_deploy.host.profile import matches_model, parse_profile
from kimi_deploy.hostside.probe_types import HardwareAnswer
from localcluster.fake_nvidia import CONFIG_PATH, LAYOUTS
from tests.e2e.demo import STATE_DIR, cluster
from tests.typed_check import problems

STATE = STATE_DIR / "state.json"
WEIGHTS_DIR = "/srv/models"
# The recipe's name for each fake NVIDIA layout, and one it must not be taken for.
RECIPE_MODELS = {"b300x8": ("B300", "GB300"), "gb300x4": ("GB300", "B300"), "h200x8": ("H200", "H100")}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)


@pytest.fixture(scope="module")
def hosts() -> list[dict[str, Any]]:
    """The demo cluster's hosts; `cluster up` starts it or finds it running (then changes nothing)."""
    cluster("up")
    found: list[dict[str, Any]] = json.loads(STATE.read_text(encoding="utf-8"))["hosts"]
    assert found
    return found


def probe(host: dict[str, Any], request: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The probe's raw answer from ``host`` in one SSH round-trip, and that round-trip's wall time."""
    state = json.loads(STATE.read_text(encoding="utf-8"))
    command = hostside_command("python3", "hardware_probe.py", request)
    started = time.monotonic()
    done = subprocess.run(
        [*root_ssh(state, host["address"]), command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    wall = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    raw: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    # the answer of the real program on a real host is what its type says, key for key
    assert problems(raw, HardwareAnswer) == []
    print(f"{host['name']}: probe {raw['elapsed_s'] * 1000:.0f} ms on the host, {wall * 1000:.0f} ms with SSH")
    return raw, wall


def _nvidia_host(host: dict[str, Any]) -> str:
    if host.get("state") != "running":
        pytest.skip(f"{host['name']} is {host.get('state')}")
    hardware = str(host.get("hardware"))
    if hardware not in LAYOUTS:
        pytest.skip(f"{host['name']} has {hardware}: its fake accelerators are not on PCI or behind nvidia-smi")
    return hardware


def test_probe_reads_the_fake_accelerators_os_and_disk(hosts: list[dict[str, Any]]) -> None:
    for host in hosts:
        _check_profile(host)


def _check_profile(host: dict[str, Any]) -> None:
    hardware = _nvidia_host(host)
    raw, _ = probe(host, {"weights_dir": WEIGHTS_DIR})
    assert raw["elapsed_s"] < 5
    profile = parse_profile(raw)
    acc = profile["accelerators"]
    layout = LAYOUTS[hardware]
    assert (acc["vendor"], acc["count"], acc["error"]) == ("nvidia", len(layout.bus_ids), None)
    assert (acc["model"], acc["memory_mib"]) == (layout.model.name, layout.model.memory_mib)
    wanted, other = RECIPE_MODELS[hardware]
    assert matches_model(acc["model"], wanted)
    assert not matches_model(acc["model"], other)
    assert [d["pci_bus_id"] for d in acc["devices"]] == list(layout.bus_ids)
    assert acc["topology"] is not None
    assert len(acc["topology"]["gpus"]) == len(layout.bus_ids)
    # The host's own description, read from its root on this machine: same GPUs, same driver.
    config = Path(host["root"]) / CONFIG_PATH
    if config.is_file():
        described = json.loads(config.read_text(encoding="utf-8"))
        assert [d["uuid"] for d in acc["devices"]] == [g["uuid"] for g in described["gpus"]]
        assert acc["driver_version"] == described["driver_version"]
    assert profile["os"]["id"] == "debian"
    assert profile["os"]["kernel"]
    assert profile["disk"]["path"] == WEIGHTS_DIR
    assert (profile["disk"]["free_bytes"] or 0) > 0
    assert profile["disk"]["read_mb_s"] is None
    assert (profile["memory"]["total_bytes"] or 0) > 0
    assert (profile["cpu"]["count"] or 0) >= 1
    assert profile["errors"] == {}


def test_measured_read_of_the_weights_disk(hosts: list[dict[str, Any]]) -> None:
    for host in hosts:
        _check_measured(host)


def _check_measured(host: dict[str, Any]) -> None:
    _nvidia_host(host)
    raw, _ = probe(host, {"weights_dir": WEIGHTS_DIR, "measure": True})
    assert raw["elapsed_s"] < 5
    profile = parse_profile(raw)
    assert (profile["disk"]["read_mb_s"] or 0) > 0
    assert profile["errors"] == {}
    if raw["disk"]["read"]["source"] == "temp":
        models = Path(host["root"]) / WEIGHTS_DIR.lstrip("/")
        if models.is_dir():
            assert not [p.name for p in models.iterdir() if p.name.startswith(".kimi-read-probe-")]
