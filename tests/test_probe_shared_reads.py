"""The host probe's reads that serve several parts at once or read the kernel another way
(hostside/unit_show.py, hostside/listening.py) answer what each part's own read answers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import hostside_command
from kimi_deploy.hostside import unit_show
from kimi_deploy.hostside.listening import listening
from kimi_deploy.hostside.unit_show import UnitShow

# starts processes and listens on loopback: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

# A systemd of three services and a timer, its properties in the order D-Bus sends them (a service's
# first); ``show`` prints what systemd 252's ``systemctl show --property=...`` prints: a block per
# unit asked, in the order asked, the properties named, a blank line between blocks.
FAKE_SYSTEMCTL = r"""
import os, sys
UNITS = {
    "nvidia-fabricmanager.service": {"MainPID": "0", "NRestarts": "0", "ActiveState": "active", "SubState": "running",
                                     "UnitFileState": "enabled", "NeedDaemonReload": "no",
                                     "StateChangeTimestampMonotonic": "0"},
    "nvidia-imex.service": {"MainPID": "0", "NRestarts": "0", "ActiveState": "inactive", "SubState": "dead",
                            "UnitFileState": "disabled", "NeedDaemonReload": "no", "StateChangeTimestampMonotonic": "0"},
    "kimi-vllm.service": {"MainPID": "4242", "NRestarts": "2", "ActiveState": "active", "SubState": "running",
                          "UnitFileState": "enabled", "NeedDaemonReload": "yes", "StateChangeTimestampMonotonic": "0"},
    "kimi-scrub.timer": {"ActiveState": "active", "SubState": "waiting", "UnitFileState": "enabled",
                         "NeedDaemonReload": "no", "StateChangeTimestampMonotonic": "0"},
}
ORDER = ["MainPID", "NRestarts", "Id", "ActiveState", "SubState", "UnitFileState", "StateChangeTimestampMonotonic",
         "NeedDaemonReload"]
with open(os.environ["KIMI_TEST_CALLS"], "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
assert args[0] == "show", args
props, names = [], []
i = 1
while i < len(args):
    if args[i] == "-p":
        props += args[i + 1].split(","); i += 2
    elif args[i].startswith("--property="):
        props += args[i].split("=", 1)[1].split(","); i += 1
    else:
        names.append(args[i]); i += 1
blocks = []
for name in names:
    unit = name if "." in name else name + ".service"
    values = {"Id": unit, **UNITS.get(unit, {"MainPID": "0", "NRestarts": "0", "ActiveState": "inactive",
                                             "SubState": "dead", "UnitFileState": "", "NeedDaemonReload": "no",
                                             "StateChangeTimestampMonotonic": "0"})}
    blocks.append("".join(f"{k}={values[k]}\n" for k in ORDER if k in values and k in props))
sys.stdout.write("\n".join(blocks))
"""


@pytest.fixture
def tools(tmp_path: Path) -> tuple[Path, Path]:
    """A PATH with the fake systemctl (and the system's own tools after it), and its calls' log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(f"#!{sys.executable}\n{FAKE_SYSTEMCTL}", encoding="utf-8")
    systemctl.chmod(0o755)
    return bin_dir, tmp_path / "calls"


def _run(command: str, bin_dir: Path, calls: Path) -> str:
    done = subprocess.run(
        ["/bin/sh", "-c", command],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "KIMI_TEST_CALLS": str(calls)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout


def _alone(script: str, request: dict[str, Any], bin_dir: Path, calls: Path) -> Any:
    """The answer of hostside/<script> run by itself: its one JSON line."""
    return json.loads(_run(hostside_command(sys.executable, script, request), bin_dir, calls).splitlines()[-1])


def _parts(tmp_path: Path) -> dict[str, Any]:
    return {
        "hardware": {"root": str(tmp_path), "weights_dir": str(tmp_path), "nvml": False, "topology": False},
        "drivers": {"nvidia": False, "services": ["nvidia-fabricmanager", "nvidia-imex-channel", "nvidia-imex"]},
        "state": {"user": "root", "units": ["kimi-vllm", "kimi-gateway"], "timers": ["kimi-scrub"]},
    }


def _together_and_alone(tmp_path: Path, bin_dir: Path, calls: Path) -> tuple[dict[str, Any], list[str]]:
    """Each part's answer from the host probe, checked against the part alone; the host probe's
    systemctl calls."""
    parts = _parts(tmp_path)
    out = _run(hostside_command(sys.executable, "host_probe.py", parts), bin_dir, calls)
    together = {tag: json.loads(text) for tag, text in (line.split(" ", 1) for line in out.splitlines())}
    asked = calls.read_text(encoding="utf-8").splitlines()
    calls.unlink()
    hardware = _alone("hardware_probe.py", parts["hardware"], bin_dir, calls)
    assert together["hardware"]["drivers"]["services"] == hardware["drivers"]["services"]
    drivers = _alone("driver_probe.py", parts["drivers"], bin_dir, calls)
    assert together["drivers"]["services"] == drivers["services"]
    state = _alone("state_probe.py", parts["state"], bin_dir, calls)
    assert (together["state"]["units"], together["state"]["timers"]) == (state["units"], state["timers"])
    return together, asked


def test_one_systemctl_answers_every_part_as_its_own_would(tmp_path: Path, tools: tuple[Path, Path]) -> None:
    bin_dir, calls = tools
    together, asked = _together_and_alone(tmp_path, bin_dir, calls)
    assert len(asked) == 1, asked
    services = together["hardware"]["drivers"]["services"]
    assert services["argv"] == [
        "systemctl",
        "show",
        "--property=Id,ActiveState,UnitFileState",
        "nvidia-fabricmanager",
        "nvidia-imex",
    ]
    assert services["stdout"] == (
        "Id=nvidia-fabricmanager.service\nActiveState=active\nUnitFileState=enabled\n\n"
        "Id=nvidia-imex.service\nActiveState=inactive\nUnitFileState=disabled\n"
    )
    assert together["drivers"]["services"]["nvidia-imex-channel"] == {"active": "inactive", "enabled": ""}
    vllm = together["state"]["units"]["kimi-vllm"]
    assert (vllm["pid"], vllm["restarts"], vllm["needs_reload"]) == (4242, 2, True)
    assert together["state"]["timers"]["kimi-scrub"] == {"active": "active", "enabled": "enabled"}


def test_a_systemctl_answer_that_cannot_be_cut_leaves_each_part_asking_its_own(
    tmp_path: Path, tools: tuple[Path, Path]
) -> None:
    """A block that does not say its unit's own name (here: every unit an alias of one) is not
    cut up: each part runs its own systemctl, and answers as it does alone."""
    bin_dir, calls = tools
    systemctl = bin_dir / "systemctl"
    systemctl.write_text(
        systemctl.read_text(encoding="utf-8").replace('"Id": unit,', '"Id": "kimi-vllm.service",'), encoding="utf-8"
    )
    _, asked = _together_and_alone(tmp_path, bin_dir, calls)
    # the one for every part, then the hardware part's, the drivers part's, the state part's (the
    # state part then asks each unit whose block came back under another name alone)
    assert len(asked) >= 4, asked
    assert asked[0].startswith("show --property=Id,ActiveState,UnitFileState,SubState,MainPID")


def test_a_part_that_names_a_unit_twice_or_a_property_not_asked_is_not_answered_from_the_shared_call(
    tools: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir, calls = tools
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "KIMI_TEST_CALLS": str(calls)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(unit_show, "_ENV", {**unit_show._ENV, **env})
    shown = UnitShow([(["Id", "ActiveState"], ["nvidia-imex"]), (["Id", "SubState"], ["kimi-scrub.timer"])], 10)
    assert shown.answer(["Id", "ActiveState"], ["nvidia-imex"]) == "Id=nvidia-imex.service\nActiveState=inactive\n"
    assert shown.answer(["Id", "ActiveState"], ["nvidia-imex", "nvidia-imex"]) is None
    assert shown.answer(["Id", "UnitFileState"], ["nvidia-imex"]) is None  # a property not asked
    assert shown.answer(["Id"], ["nvidia-fabricmanager"]) is None  # a unit not asked
    assert len(calls.read_text(encoding="utf-8").splitlines()) == 1


@pytest.fixture
def listeners() -> Iterator[int]:
    """A port listened on over IPv4 and IPv6 (loopback)."""
    with socket.socket() as four:
        four.bind(("127.0.0.1", 0))
        four.listen()
        port = four.getsockname()[1]
        try:
            six = socket.socket(socket.AF_INET6)
            six.bind(("::1", port))
            six.listen()
        except OSError:
            six = None
        try:
            yield port
        finally:
            if six is not None:
                six.close()


def _from_proc(ports: set[int]) -> dict[str, int]:
    """inode -> port of the listening sockets on ``ports``, read as the state probe did before."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as f:
            next(f)
            for line in f:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if fields[3] == "0A" and port in ports:
                    found[fields[9]] = port
    return found


def test_the_kernel_dump_lists_the_listeners_proc_net_tcp_lists(listeners: int) -> None:
    with socket.socket() as other:  # a port not asked about, listened on too
        other.bind(("127.0.0.1", 0))
        other.listen()
        found = listening({listeners})
        if found is None:
            pytest.skip("no sock_diag for TCP in this kernel: the probe reads /proc/net/tcp then")
        assert found == _from_proc({listeners})
        assert len(found) >= 1
        assert other.getsockname()[1] not in found.values()
