"""The drivers step on two GB300 trays of a cluster of its own, from its apt repository.

The trays hold one TP=8 instance across both, so each gets the driver and IMEX with a node list
naming both, and the nvidia module's option that creates IMEX channel 0; no fabric manager (a
Grace Blackwell tray has no NVSwitch: the switch trays run it). In order: a first install at
580.95.05 (the version the trays' GPUs report: no reboot), a re-run that runs no command, a branch
change to 590 refused without ``--data kimi_reboot=allowed`` and, with it, both trays rebooted one
after the other and running 590 (NVML agrees) with IMEX, a fabric manager an earlier setup left on a
tray removed, and apt's own refusal as one line. The cluster (its own state directory and subnet)
is brought down at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.own_cluster import BIN, ROOT, Run
from tests.e2e.demo import drivers_recipe, host_lines, install_fabric_manager, ssh
from tests.e2e.drivers_cluster import channel, imex_major

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)

HW_DIR = Path("/var/lib/kimi-cluster-drivers")
ENV = {"KIMI_CLUSTER_DIR": str(HW_DIR), "KIMI_CLUSTER_SUBNET": "10.213.11.0/24"}
HOSTS = ("kimi-h1", "kimi-h2")
FIRST, NEW = "580.95.05", "590.48.01"
SMI = "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
PACKAGES = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-imex")
FLAG = "allow it with --data kimi_reboot=allowed"
TIMES: dict[str, float] = {}

INVENTORY = """
import json
_state = json.load(open({state!r}))
_common = {{"ssh_user": "root", "ssh_key": _state["ssh_key"], "ssh_known_hosts_file": _state["known_hosts"],
           "ssh_strict_host_key_checking": "yes", "kimi_recipe": {recipe!r},
           "kimi_nvidia_repo_url": _state["services"]["apt"]["url"]}}
drivers_gb = [(h["name"], {{"ssh_hostname": h["address"], **_common}}) for h in _state["hosts"]]
"""


def _cli(*args: str) -> None:
    subprocess.run(
        [str(BIN / "kimi-deploy"), "cluster", *args], cwd=ROOT, check=True, timeout=900, env={**os.environ, **ENV}
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    _cli("down")  # fresh trays: nothing left of an earlier run
    _cli("up", "--hardware", "gb300x4,gb300x4")
    try:
        st: dict[str, Any] = json.loads((HW_DIR / "state.json").read_text(encoding="utf-8"))
        st["dir"] = tmp_path_factory.mktemp("drivers")
        yield st
    finally:
        _cli("down")
        print("drivers step timings:", {k: round(v, 2) for k, v in TIMES.items()})


def recipe(st: dict[str, Any], **nvidia: Any) -> None:
    gb300 = {"model": "GB300", "per_host": 4, "memory_gib": 260}
    drivers_recipe(st["dir"] / "recipe.yaml", nvidia, "drivers-gb", gb300, hosts=2)


def deploy(st: dict[str, Any], *args: str, timed: str | None = None) -> Run:
    inventory = st["dir"] / "drivers.py"
    inventory.write_text(
        INVENTORY.format(state=str(HW_DIR / "state.json"), recipe=str(st["dir"] / "recipe.yaml")), encoding="utf-8"
    )
    yes = [] if "--dry" in args else ["-y"]
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "pyinfra"), str(inventory), "deploys/drivers.py", *yes, "--json", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **ENV},
    )
    if timed:
        TIMES[timed] = time.monotonic() - started
    try:
        payload = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        payload = None
    return Run(proc.returncode, payload, proc.stdout + proc.stderr)


def sh(st: dict[str, Any], host: str, command: str) -> str:
    return ssh(host, command, cluster_state=st)


def packages(st: dict[str, Any], host: str) -> dict[str, str]:
    """Installed NVIDIA packages: name -> "version status" (``hi``: held and installed)."""
    out = sh(st, host, "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev}\\n' 'nvidia-*'")
    return {w[0]: f"{w[1]} {w[2]}" for w in (line.split() for line in out.splitlines()) if len(w) == 3}


@pytest.fixture(scope="module")
def installed(cluster: dict[str, Any]) -> dict[str, Any]:
    recipe(cluster, branch="580", version=FIRST)
    dry = deploy(cluster, "--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert sorted(dry.changed()["NVIDIA driver packages"]) == list(HOSTS)
    run = deploy(cluster, timed="first install")
    assert run.code == 0, run.log[-4000:]
    assert run.errors() == {}
    return cluster


def test_first_install_pins_holds_and_starts_imex_with_its_channel(installed: dict[str, Any]) -> None:
    st = installed
    addresses = [h["address"] for h in st["hosts"]]
    for host in HOSTS:
        found = packages(st, host)
        assert {p: found[p] for p in PACKAGES} == dict.fromkeys(PACKAGES, f"{FIRST}-1 hi")
        assert found[f"nvidia-driver-pinning-{FIRST}"] == f"{FIRST}-1 ii"
        assert not any(p.startswith("nvidia-fabricmanager") for p in found)
        assert sh(st, host, f"{SMI} | sort -u") == FIRST
        assert sh(st, host, "systemctl is-active nvidia-imex") == "active"
        option = sh(st, host, "grep -v '^#' /etc/modprobe.d/nvidia-imex-channel.conf")
        assert option == "options nvidia NVreg_CreateImexChannel0=1"
        # The driver was loaded before the option: the channel's node is made now, with the major the
        # module registered (the stand-in's /proc/devices), and again at every boot.
        assert channel(st, host) == f"c {imex_major(st, host)}:0 666"
        assert sh(st, host, "systemctl is-enabled nvidia-imex-channel") == "enabled"
        nodes = sh(st, host, "grep -v '^#' /etc/nvidia-imex/nodes_config.cfg").split()
        assert nodes == addresses
        said = sh(st, host, "journalctl -u nvidia-imex -o cat --no-pager | tail -n 1")
        assert said == "IMEX daemon started with 2 nodes from /etc/nvidia-imex/nodes_config.cfg"


def test_a_rerun_runs_no_command(installed: dict[str, Any]) -> None:
    dry = deploy(installed, "--dry")
    assert dry.code == 0, dry.log[-3000:]
    assert dry.changed() == {}
    again = deploy(installed, timed="no-op re-run")
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}


def _reboots(st: dict[str, Any], host: str) -> tuple[float, float]:
    """When ``host`` went down for its driver and when it was back, from its drivers log."""

    def at(line: str) -> float:
        stamp, _ = line.split(" ", 1)
        whole, _, rest = stamp.partition(",")
        return datetime.fromisoformat(whole + rest[9:]).timestamp() + float("0." + rest[:9])

    lines = sh(st, host, "cat /var/log/kimi/drivers.log").splitlines()
    down = [at(line) for line in lines if " reboot: " in line]
    back = [at(line) for line in lines if " back: " in line]
    assert len(down) == len(back) == 1, lines
    return down[0], back[0]


def test_a_branch_change_reboots_only_with_the_flag_and_one_host_at_a_time(installed: dict[str, Any]) -> None:
    st = installed
    recipe(st, branch="590")
    before = {h: packages(st, h) for h in HOSTS}
    refused = deploy(st)
    assert refused.code != 0
    assert host_lines(refused.log, "kimi-deploy: preflight: ", HOSTS) == {
        h: [f"{h}: drivers: a reboot is needed to load driver 590.* ({FIRST} is loaded); {FLAG}"] for h in HOSTS
    }
    assert {h: packages(st, h) for h in HOSTS} == before

    run = deploy(st, "--data", "kimi_reboot=allowed", timed="branch change with reboots")
    assert run.code == 0, run.log[-4000:]
    assert sorted(run.changed()["Reboot into the NVIDIA driver"]) == list(HOSTS)
    spans = sorted(_reboots(st, h) for h in HOSTS)
    TIMES["one reboot, down to back"] = max(back - down for down, back in spans)
    assert spans[0][1] <= spans[1][0], f"both hosts were down at once: {spans}"
    for host in HOSTS:
        assert sh(st, host, f"{SMI} | sort -u") == NEW
        assert sh(st, host, "test -e /run/reboot-required && echo pending || echo none") == "none"
        found = packages(st, host)
        assert {p: found[p] for p in PACKAGES} == dict.fromkeys(PACKAGES, f"{NEW}-1 hi")
        assert found["nvidia-driver-pinning-590"] == "590-1 ii"
        assert f"nvidia-driver-pinning-{FIRST}" not in found
        assert sh(st, host, "systemctl is-active nvidia-imex") == "active"
        assert channel(st, host) == f"c {imex_major(st, host)}:0 666"  # /dev is new after the reboot
        assert sh(st, host, "tail -n 1 /var/log/kimi/drivers.log").endswith(f"back: driver {NEW} loaded, NVML agrees")
    again = deploy(st)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}


def test_a_fabric_manager_left_on_a_tray_is_removed(installed: dict[str, Any], tmp_path: Path) -> None:
    st = installed
    recipe(st, branch="590")
    # A branch-named fabric manager package (580.82.07-1), as a tray set up earlier may hold.
    install_fabric_manager(st, "kimi-h1", tmp_path)
    before = packages(st, "kimi-h1")
    assert "nvidia-fabricmanager-580" in before
    run = deploy(st)
    assert run.code == 0, run.log[-3000:]
    assert run.changed() == {"NVIDIA fabric manager removed": ["kimi-h1"]}
    after = packages(st, "kimi-h1")
    assert "nvidia-fabricmanager-580" not in after
    assert after == {p: v for p, v in before.items() if p != "nvidia-fabricmanager-580"}
    again = deploy(st)
    assert again.code == 0, again.log[-3000:]
    assert again.changed() == {}


def test_a_release_the_repository_lacks_is_refused_naming_what_it_has(installed: dict[str, Any]) -> None:
    st = installed
    recipe(st, branch="590", version="590.44.01")  # no such release in the repository
    before = packages(st, "kimi-h2")
    run = deploy(st, "--limit", "kimi-h2", "--data", "kimi_reboot=allowed")
    assert run.code != 0
    tree = f"{st['services']['apt']['url'].rstrip('/')}/debian12/x86_64"
    assert host_lines(run.log, "kimi-deploy: drivers: ", HOSTS)["kimi-h2"] == [
        f"{tree} has no nvidia-driver-pinning-590.44.01: it pins branches 580, 590 "
        "and releases 580.95.05, 580.105.08, 590.48.01"
    ]
    assert packages(st, "kimi-h2") == before
    assert sh(st, "kimi-h2", f"{SMI} | sort -u") == NEW
