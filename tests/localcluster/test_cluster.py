"""End to end: the local cluster is real hosts, reached over real SSH with strict host keys."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from localcluster import process_argv
from localcluster.cli import hardware_plan
from localcluster.fake_nvidia import proc_devices
from localcluster.hardware_spec import SMALL_DISK_BYTES, HardwareSpec, parse_spec
from localcluster.image import debian_mirror
from localcluster.state import ClusterError, Settings
from tests.localcluster.conftest import HOSTS, TIMINGS, Cluster, checked, cluster_cli, why_not_here

pytestmark = pytest.mark.localcluster


def names(cluster: Cluster) -> list[str]:
    return [h["name"] for h in cluster.state["hosts"]]


def test_state_describes_four_hosts(cluster: Cluster) -> None:
    state = cluster.state
    settings = cluster.settings  # the tests' own cluster (tests/conftest.py), laid out as the default one
    assert state["version"] == 1
    assert (state["bridge"], state["subnet"], state["gateway"]) == (
        settings.bridge,
        str(settings.subnet),
        settings.gateway,
    )
    assert [(h["name"], h["address"]) for h in state["hosts"]] == [
        (f"kimi-h{i}", settings.host_address(i)) for i in range(1, HOSTS + 1)
    ]
    assert {h["state"] for h in state["hosts"]} == {"running"}
    assert {h["hardware"] for h in state["hosts"]} == {"b300x8"}
    assert all(Path(h["root"], "etc/os-release").is_file() for h in state["hosts"])


def test_hosts_answer_over_ssh_with_strict_host_keys(cluster: Cluster) -> None:
    for name in names(cluster):
        assert cluster.ssh(name, "hostname").stdout.strip() == name


def test_unknown_host_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("", encoding="utf-8")
    argv = cluster.ssh_argv("kimi-h1", "true", known_hosts=str(empty))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr


def test_root_logs_in_by_key_only(cluster: Cluster) -> None:
    address = cluster.host("kimi-h1")["address"]
    argv = [
        "ssh",
        "-o",
        f"UserKnownHostsFile={cluster.state['known_hosts']}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "PubkeyAuthentication=no",
        f"root@{address}",
        "true",
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 255
    assert "Permission denied (publickey)" in proc.stderr


def test_each_host_has_its_own_address_and_filesystem(cluster: Cluster) -> None:
    for host in cluster.state["hosts"]:
        addresses = cluster.ssh(host["name"], "ip -4 -o addr show dev eth0").stdout
        assert f"inet {host['address']}/24" in addresses
    marker = f"/root/only-on-h1-{uuid.uuid4().hex}"
    cluster.ssh("kimi-h1", f"touch {marker}")
    try:
        assert cluster.ssh("kimi-h1", f"test -e {marker}", check=False).returncode == 0
        assert cluster.ssh("kimi-h2", f"test -e {marker}", check=False).returncode == 1
        assert Path(cluster.host("kimi-h1")["root"] + marker).exists()
    finally:
        cluster.ssh("kimi-h1", f"rm -f {marker}")


def test_systemd_is_pid_1_and_the_system_is_up(cluster: Cluster) -> None:
    for name in names(cluster):
        assert cluster.ssh(name, "ps -o comm= -p 1").stdout.strip() == "systemd"
        state = cluster.ssh(name, "systemctl is-system-running", check=False).stdout.strip()
        assert state in ("running", "degraded"), f"{name}: {state}"


def test_hosts_reach_each_other_by_name(cluster: Cluster) -> None:
    probe = "import socket; print(socket.create_connection(('kimi-h2', 22), timeout=5).recv(4).decode())"
    assert cluster.ssh("kimi-h1", f"python3 -c {shlex.quote(probe)}").stdout.strip() == "SSH-"


def test_hosts_have_no_route_off_the_cluster(cluster: Cluster) -> None:
    # Checked on the routing table only: nothing is ever sent off the cluster, not even by tests.
    routes = cluster.ssh("kimi-h1", "ip -4 route show").stdout
    assert "default" not in routes
    assert f"{cluster.settings.subnet} dev eth0" in routes


def test_services_listen_on_the_gateway(cluster: Cluster) -> None:
    for name, service in cluster.state["services"].items():
        url = urlsplit(service["url"])
        assert url.hostname == cluster.state["gateway"], name
        assert url.port is not None
        with socket.create_connection((url.hostname, url.port), timeout=5):
            pass


def test_status_json_matches_state_file(cluster: Cluster) -> None:
    proc = checked(cluster_cli("status", "--json", env=cluster.env))
    assert json.loads(proc.stdout) == cluster.state


def test_up_again_changes_nothing(cluster: Cluster) -> None:
    before = cluster.state
    started = time.monotonic()
    checked(cluster_cli("up", "--hosts", str(HOSTS), env=cluster.env))
    TIMINGS["up again, 4 hosts running (no-op)"] = time.monotonic() - started
    after = cluster.state
    assert [h["pid"] for h in after["hosts"]] == [h["pid"] for h in before["hosts"]]
    assert {n: s["pid"] for n, s in after["services"].items()} == {n: s["pid"] for n, s in before["services"].items()}
    assert cluster.ssh("kimi-h1", "hostname").stdout.strip() == "kimi-h1"


def _leftovers(settings: Settings, netns: str, veth: str) -> list[str]:
    found = []
    if netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split():
        found.append(f"netns {netns}")
    for link in (veth, settings.bridge):
        if subprocess.run(["ip", "link", "show", "dev", link], capture_output=True, check=False).returncode == 0:
            found.append(f"link {link}")
    mounts = Path("/proc/self/mountinfo").read_text(encoding="utf-8")
    found += [f"mount {line.split()[4]}" for line in mounts.splitlines() if str(settings.state_dir) in line]
    found += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/kimi-cluster/{settings.bridge}")]
    return found


def test_one_host_cluster_elsewhere_goes_up_and_down_without_a_trace(cluster: Cluster, tmp_path: Path) -> None:
    if why_not_here() is not None:
        pytest.skip(why_not_here() or "")
    env = {**os.environ, "KIMI_CLUSTER_DIR": str(tmp_path / "cluster"), "KIMI_CLUSTER_SUBNET": "10.213.8.0/24"}
    other = Cluster(Settings.from_env(env), env)
    default_pids = [h["pid"] for h in cluster.state["hosts"]]
    netns, veth = other.settings.netns("kimi-h1"), other.settings.veth("10.213.8.11")
    assert netns != "kimi-h1"
    assert other.settings.bridge != "kimibr0"

    started = time.monotonic()
    checked(cluster_cli("up", "--hosts", "1", env=env))
    TIMINGS["up, 1 host in a second cluster"] = time.monotonic() - started
    try:
        state = other.state
        assert [(h["name"], h["address"]) for h in state["hosts"]] == [("kimi-h1", "10.213.8.11")]
        assert other.ssh("kimi-h1", "hostname").stdout.strip() == "kimi-h1"
        recorded = [h["pid"] for h in state["hosts"]] + [s["pid"] for s in state["services"].values()]
        assert all(process_argv(pid) for pid in recorded)
        assert _leftovers(other.settings, netns, veth) != []
    finally:
        started = time.monotonic()
        checked(cluster_cli("down", env=env))
        TIMINGS["down, 1 host in a second cluster"] = time.monotonic() - started

    assert _leftovers(other.settings, netns, veth) == []
    assert [pid for pid in recorded if process_argv(pid) is not None] == []
    assert not other.settings.state_file.exists()
    assert not (other.settings.state_dir / "hosts").exists()
    checked(cluster_cli("down", env=env))
    # The default cluster did not notice.
    assert [h["pid"] for h in cluster.state["hosts"]] == default_pids
    assert cluster.ssh("kimi-h1", "hostname").stdout.strip() == "kimi-h1"


# Pure parts, no cluster needed.


def test_hardware_plan_gives_one_spec_per_host() -> None:
    assert hardware_plan(None, None) == ["b300x8"] * 4
    assert hardware_plan(2, ["h200x8"]) == ["h200x8", "h200x8"]
    assert hardware_plan(None, ["h200x8,tpu7x4", "smalldisk"]) == ["h200x8", "tpu7x4", "smalldisk"]
    with pytest.raises(ClusterError, match=r"^--hosts 3 with 2 --hardware specs"):
        hardware_plan(3, ["h200x8", "b300x8"])
    with pytest.raises(ClusterError, match=r"^--hardware 'B300;x'"):
        hardware_plan(None, ["B300;x"])
    with pytest.raises(ClusterError, match=r"^--hosts 0: must be between 1 and 64"):
        hardware_plan(0, None)


def test_names_of_a_second_cluster_do_not_collide_with_the_default_one() -> None:
    default = Settings.from_env({})
    other = Settings.from_env({"KIMI_CLUSTER_SUBNET": "10.213.8.0/24", "KIMI_CLUSTER_DIR": "/tmp/x"})
    assert (default.bridge, default.gateway, default.host_address(1)) == ("kimibr0", "10.213.7.1", "10.213.7.11")
    assert (other.bridge, other.gateway, other.host_address(1)) == ("kimibr-0ad50800", "10.213.8.1", "10.213.8.11")
    assert default.netns("kimi-h1") == "kimi-h1"
    assert other.netns("kimi-h1") != "kimi-h1"
    assert default.veth(default.host_address(1)) != other.veth(other.host_address(1))
    assert all(len(name) <= 15 for name in (other.bridge, other.veth(other.host_address(1))))
    with pytest.raises(ClusterError, match=r"^KIMI_CLUSTER_DIR='/tmp/a,b': must be an absolute path"):
        Settings.from_env({"KIMI_CLUSTER_DIR": "/tmp/a,b"})


def test_the_debian_mirror_is_read_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.list.disabled").write_text("deb http://wrong.invalid/debian bookworm main\n")
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb deb-src\nURIs: http://mirror.invalid/debian/\nSuites: bookworm bookworm-updates\n"
    )
    assert debian_mirror(tmp_path) == "http://mirror.invalid/debian"
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian bookworm main\n"
    )
    assert debian_mirror(tmp_path) == "http://one.invalid/debian"
    (tmp_path / "sources.list").write_text("")
    (tmp_path / "sources.list.d" / "debian.sources").write_text("")
    with pytest.raises(ClusterError, match=r"no 'deb' source for Debian bookworm"):
        debian_mirror(tmp_path)


def test_a_hardware_spec_names_the_accelerators_the_disk_and_the_system() -> None:
    assert parse_spec("b300x8") == HardwareSpec("b300x8", None, "debian12")
    assert parse_spec("gb300x4-ubuntu24.04") == HardwareSpec("gb300x4", None, "ubuntu24.04")
    assert parse_spec("b300x8-smalldisk-ubuntu24.04") == HardwareSpec("b300x8", SMALL_DISK_BYTES, "ubuntu24.04")
    assert hardware_plan(None, ["gb300x4-ubuntu24.04,b300x8"]) == ["gb300x4-ubuntu24.04", "b300x8"]


def test_nvidia_hosts_see_the_imex_channels_device_registered_at_a_free_dynamic_major() -> None:
    real = "Character devices:\n  1 mem\n253 dimmctl\n254 ndctl\n\nBlock devices:\n  7 loop\n252 zram\n"
    assert proc_devices(real) == (
        "Character devices:\n  1 mem\n252 nvidia-caps-imex-channels\n253 dimmctl\n254 ndctl\n\n"
        "Block devices:\n  7 loop\n252 zram\n"
    )
