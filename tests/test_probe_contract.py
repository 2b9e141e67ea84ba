"""The probes' answers are what ``hostside.probe_types`` says, key for key: the real programs
(the state, drivers and hardware probes), bundled and run as a deploy runs them on a host
(``hostside_command``), on this machine, for requests that find each section in each of its
states, and their facts reading them.

On a converged host of the local cluster the same answer is read by every end-to-end converge
(``tests/e2e``); here each section is made to hold something: a release installed and one absent,
weights verified, missing, changed and stray, files present, absent and of another mode, a unit
and a timer systemd does not know, a port something listens on, packages installed and not, the
``current`` link, and the release log with its records (for a rollback's request).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.host.command import hostside_command, pack
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside import driver_probe, state_probe, venv_install
from kimi_deploy.hostside.probe_types import DriversAnswer, HardwareAnswer, StateAnswer
from kimi_deploy.hostside.requests import DriversRequest, HardwareRequest, StateRequest
from kimi_pyinfra.facts.drivers import DriversState
from kimi_pyinfra.facts.host_state import KimiHostState
from tests.typed_check import problems

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[1]


def _release(root: Path) -> Path:
    """A release folder as the install leaves it: a file, its lock, manifest and marker."""
    (root / "bin").mkdir(parents=True)
    (root / "bin/python").symlink_to("/usr/bin/python3")
    (root / venv_install.LOCK).write_text("vllm==0.34.0 --hash=sha256:" + "0" * 64 + "\n")
    (root / venv_install.MANIFEST).write_text(json.dumps({"files": venv_install._manifest(str(root))}))
    marker = {
        "package": "vllm",
        "version": "0.34.0",
        "requirements": ["vllm==0.34.0"],
        "index_url": "http://i/simple",
        "lock": {"sha256": "a" * 64, "platform": "x86_64", "packages": 1},
        "uv": "0.13.9",
        "manifest": venv_install.MANIFEST,
    }
    (root / venv_install.MARKER).write_text(json.dumps(marker))
    return root


def _request(tmp_path: Path, port: int) -> StateRequest:
    release = _release(tmp_path / "engines/vllm-0.34.0")
    models = tmp_path / "models"
    revision = models / ("a" * 40)
    # revision folders the deploy made hold .kimi (the verification cache's folder)
    (revision / ".kimi").mkdir(parents=True)
    (revision / "config.json").write_text("{}")
    (revision / "stray.bin").write_text("x")
    (models / ("b" * 40) / ".kimi").mkdir(parents=True)
    secret = tmp_path / "secret.env"
    secret.write_text("KEY=1\n")
    secret.chmod(0o640)
    (tmp_path / "current").symlink_to(release)
    (tmp_path / "edited.conf").write_text("edited\n")
    return {
        "user": "root",
        "venvs": [str(release), str(tmp_path / "engines/absent")],
        "weights": [{"dir": str(revision), "lock": {"config.json": [2, "sha256:" + "1" * 64], "gone.bin": [1, "x"]}}],
        "files": [str(secret), str(tmp_path / "absent.conf")],
        "units": ["kimi-contract-no-such-unit"],
        "unit_secrets": {"kimi-contract-no-such-unit": [str(secret)]},
        "unit_files": {"kimi-contract-no-such-unit": [str(tmp_path / "absent.conf")]},
        "timers": ["kimi-contract-no-such-timer"],
        "ports": [port],
        "models": [str(models)],
        "link": str(tmp_path / "current"),
        "packages": ["bash", "kimi-contract-no-such-package"],
        "releases": True,
        # a run with --diff: the host's text of each file that differs from these digests
        "diff": {str(tmp_path / "edited.conf"): "0" * 64, str(tmp_path / "absent.conf"): "0" * 64},
    }


@pytest.fixture
def listener() -> Any:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_the_state_probe_run_as_on_a_host_answers_in_its_types(tmp_path: Path, listener: int) -> None:
    command = hostside_command("python3", "state_probe.py", _request(tmp_path, listener))
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60)
    answer = json.loads(run.stdout.splitlines()[-1])
    assert problems(answer, StateAnswer) == []
    # each section holds what the request made it hold, so the check above covered it
    assert answer["user"] is True
    assert answer["venvs"][str(tmp_path / "engines/absent")] is None
    assert answer["venvs"][str(tmp_path / "engines/vllm-0.34.0")]["damaged"] is None
    weights = answer["weights"][str(tmp_path / "models" / ("a" * 40))]
    assert (weights["missing"], weights["unverified"]) == (["gone.bin"], ["config.json"])
    assert weights["extra"] == ["stray.bin"]
    secret, absent = str(tmp_path / "secret.env"), str(tmp_path / "absent.conf")
    assert answer["files"] == {secret: hashlib.sha256(b"KEY=1\n").hexdigest(), absent: None}
    assert answer["owners"] == {secret: "root:root:640", absent: None}
    assert answer["packages"] == {"bash": True, "kimi-contract-no-such-package": False}
    assert answer["listeners"][str(listener)]["pid"] == os.getpid()
    assert sorted(answer["revisions"][str(tmp_path / "models")]["present"]) == ["a" * 40, "b" * 40]
    assert answer["current"] == str(tmp_path / "engines/vllm-0.34.0")
    assert set(answer["units"]) == {"kimi-contract-no-such-unit"}
    assert answer["contents"] == {
        str(tmp_path / "edited.conf"): {"size": 7, "text": "edited\n", "why": ""},
        absent: None,
    }
    # and the fact reads it into the converge's type
    found = KimiHostState().process([f"state {run.stdout.splitlines()[-1]}"])
    assert problems(found, HostState) == []


def test_the_release_log_and_its_records_answer_in_their_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rollback's part of the answer: the release log (at its own path here) and each release
    it names, whole, gone or without a record."""
    release = tmp_path / "releases/r1"
    (release / "files").mkdir(parents=True)
    (release / "engine").symlink_to(_release(tmp_path / "engines/vllm-0.34.0"))
    (release / "release.json").write_text(
        json.dumps({"units": {"kimi-vllm": "d" * 64}, "files": [], "revision": "a" * 40})
    )
    # the serving benchmark's figures the release keeps (hostside/bench_record.py), read as they are
    bench = {"release": "r1", "at": "2026-12-02T00:00:30Z", "figures": {"targets": {}}}
    (release / "bench.json").write_text(json.dumps(bench))
    log = tmp_path / "releases.log"
    log.write_text(
        f"2026-12-02T00:00:00Z {release} serving run-1\n2026-12-02T00:01:00Z {tmp_path}/releases/gone switched\n"
    )
    real_log = state_probe._release_log
    monkeypatch.setattr(state_probe, "_release_log", lambda: real_log(str(log)))
    (tmp_path / "req").mkdir()
    monkeypatch.setattr("sys.argv", ["state_probe.py", pack(_request(tmp_path / "req", 0))])
    state_probe.main()
    answer = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert problems(answer, StateAnswer) == []
    records = answer["releases"]["records"]
    assert records[str(release)]["engine"] is True
    assert records[f"{tmp_path}/releases/gone"] is None
    assert records[str(release)]["bench"] == bench
    assert answer["last_release"][1:] == [f"{tmp_path}/releases/gone", "switched"]
    # the units of a release the log names are probed too (a rollback restarts them)
    assert "kimi-vllm" in answer["units"]


def test_a_units_since_is_when_it_entered_its_state_by_the_hosts_clock() -> None:
    """systemd keeps the monotonic time of a unit's last change of state: 90 s before now is now's
    wall time less 90 s; a unit with no time (never changed state since boot) has none."""
    monotonic_us = int((time.monotonic() - 90) * 1e6)
    since = state_probe._since({"StateChangeTimestampMonotonic": str(monotonic_us)})
    assert since is not None
    assert abs(since - (time.time() - 90)) < 2
    assert state_probe._since({"StateChangeTimestampMonotonic": "0"}) is None
    assert state_probe._since({}) is None


def test_the_check_finds_what_the_types_refuse() -> None:
    """The type check is not vacuous: a key of another name, a missing key, a number for a flag."""
    unit = {
        "active": "active",
        "sub": "running",
        "since": 1_780_000_000.0,
        "pid": 1,
        "enabled": "enabled",
        "applied": None,
        "secrets_changed": False,
        "files_changed": False,
        "needs_reload": False,
        "restarts": 0,
        "restarts_verified": 0,
        "verified": True,
        "down_s": None,
        "context": None,
    }
    answer: dict[str, Any] = {
        "user": True,
        "venvs": {},
        "weights": {},
        "files": {},
        "owners": {},
        "units": {"u": unit},
        "timers": {},
        "revisions": {},
        "listeners": {},
        "packages": {},
        "current": None,
        "last_release": None,
        "releases": None,
        "ladder": [],
        "watchdog": None,
        "platform": {"python": "3.11", "machine": "x86_64", "libc": "glibc 2.36"},
        "router_drained": [],
    }
    assert problems(answer, StateAnswer) == []
    assert problems({**answer, "free": 1}, StateAnswer) == ["answer: 'free' is not a key of StateAnswer"]
    assert problems({**answer, "units": {"u": {**unit, "restarts": True}}}, StateAnswer) == [
        "answer.units['u'].restarts: True is not int"
    ]
    missing = {k: v for k, v in answer.items() if k != "listeners"}
    assert problems(missing, StateAnswer) == ["answer: 'listeners' missing (StateAnswer)"]


def test_the_drivers_probe_run_as_on_a_host_answers_in_its_types(tmp_path: Path) -> None:
    """The drivers probe on this machine (no NVIDIA driver: no module, NVML unasked), asked about
    a file present and one absent, a unit systemd does not know, a sysctl and one that is not."""
    present = tmp_path / "nodes_config.cfg"
    present.write_text("10.0.0.1\n")
    request = {
        "nvidia": False,
        "services": ["kimi-contract-no-such-unit"],
        "files": [str(present), str(tmp_path / "absent.cfg")],
        "sysctl": ["vm.max_map_count", "no.such.key"],
    }
    command = hostside_command("python3", "driver_probe.py", request)
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60)
    line = run.stdout.splitlines()[-1]
    answer = json.loads(line)
    assert problems(answer, DriversAnswer) == []
    assert answer["files"][str(tmp_path / "absent.cfg")] is None
    assert answer["files"][str(present)] is not None
    assert answer["sysctl"]["no.such.key"] is None
    assert answer["sysctl"]["vm.max_map_count"] is not None
    assert set(answer["services"]) == {"kimi-contract-no-such-unit"}
    assert answer["nvml"] is None
    # the fact reads it as is, alone and within the host probe's answer
    assert problems(DriversState().process([line]), DriversAnswer) == []


def _sysfs(root: Path) -> None:
    """A host's /sys under ``root`` (the probe's ``root``): two InfiniBand ports, a TPU on PCI
    (Google's vendor id) and an NVIDIA GPU without a driver."""
    for device, port in (("mlx5_0", "1"), ("mlx5_1", "1")):
        folder = root / f"sys/class/infiniband/{device}/ports/{port}"
        folder.mkdir(parents=True)
        for name, value in (
            ("state", "4: ACTIVE"),
            ("phys_state", "5: LinkUp"),
            ("rate", "400 Gb/sec (4X NDR)"),
            ("link_layer", "InfiniBand"),
        ):
            (folder / name).write_text(value + "\n")
    for address, vendor, device, cls in (
        ("0000:00:04.0", "0x1ae0", "0x0075", "0x120000"),
        ("0000:1a:00.0", "0x10de", "0x2901", "0x030200"),
    ):
        folder = root / f"sys/bus/pci/devices/{address}"
        folder.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (folder / name).write_text(value + "\n")


def test_the_hardware_probe_run_as_on_a_host_answers_in_its_types(tmp_path: Path) -> None:
    """The hardware probe on this machine with a /sys of its own (RDMA ports, a TPU on PCI whose
    metadata server does not answer, an NVIDIA GPU without a driver) and a measured read."""
    root = tmp_path / "root"
    _sysfs(root)
    (tmp_path / "models").mkdir()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    request = {
        "root": str(root),
        "weights_dir": str(tmp_path / "models"),
        "measure": True,
        "nvml": False,
        "metadata_url": f"http://127.0.0.1:{port}/computeMetadata/v1/instance/attributes",
    }
    command = hostside_command("python3", "hardware_probe.py", request)
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60)
    answer = json.loads(run.stdout.splitlines()[-1])
    assert problems(answer, HardwareAnswer) == []
    assert [p["device"] for p in answer["rdma"]["ports"]] == ["mlx5_0", "mlx5_1"]
    assert [d["address"] for d in answer["tpu"]["pci"]] == ["0000:00:04.0"]
    assert answer["tpu"]["metadata"] is not None  # asked, and its error said
    assert [d["address"] for d in answer["nvidia"]["pci_gpus"]["devices"]] == ["0000:1a:00.0"]
    assert answer["disk"]["read"] is not None


def test_the_host_probe_answers_every_part_in_one_process_as_each_alone(tmp_path: Path, listener: int) -> None:
    """What a converge sends (``KimiHostState``'s command: the state, hardware and drivers parts
    in one process) answers each part as that probe alone does, and the fact reads all three."""
    state = _request(tmp_path / "state", listener)
    hardware: HardwareRequest = {
        "root": str(tmp_path / "root"),
        "weights_dir": str(tmp_path),
        "nvml": False,
        "metadata_url": "http://127.0.0.1:9/computeMetadata/v1/instance/attributes",
    }
    drivers: DriversRequest = {
        "nvidia": False,
        "services": ["kimi-contract-no-such-unit"],
        "sysctl": ["vm.max_map_count"],
    }
    _sysfs(tmp_path / "root")
    command = KimiHostState().command(state, hardware=hardware, drivers=drivers)
    assert command.count("python3") == 1
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True, timeout=60)
    lines = run.stdout.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["hardware", "drivers", "state"]
    alone = {
        "state": hostside_command("python3", "state_probe.py", state),
        "drivers": hostside_command("python3", "driver_probe.py", drivers),
    }
    for line in lines:
        tag, text = line.split(" ", 1)
        if tag in alone:
            by_itself = subprocess.run(["bash", "-c", alone[tag]], capture_output=True, text=True, check=True)
            together, apart = json.loads(text), json.loads(by_itself.stdout.splitlines()[-1])
            if tag == "drivers":  # read a moment apart: the same keys, the same files, OS and packages
                assert (together.keys(), together["os"], together["packages"]) == (
                    apart.keys(),
                    apart["os"],
                    apart["packages"],
                )
            else:
                assert together == apart
    found = KimiHostState().process(lines)
    assert problems(found, HostState) == []
    assert found["hardware"] is not None
    assert found["drivers"] is not None
    assert problems(found["drivers"], DriversAnswer) == []


def test_a_part_that_raises_leaves_the_others_answering() -> None:
    # a state request with a port that is no number: that part raises, the drivers part answers
    drivers = {"nvidia": False, "services": []}
    command = hostside_command(
        "python3", "host_probe.py", {"state": {"user": "root", "ports": ["x"]}, "drivers": drivers}
    )
    run = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 1
    assert [line.split(" ", 1)[0] for line in run.stdout.splitlines()] == ["drivers"]
    assert "ValueError: invalid literal for int() with base 10: 'x'" in run.stderr


SMI_FIELDS = ["index", "name", "uuid", "memory.total", "pci.bus_id", "driver_version", "compute_cap"]
MISMATCH = ROOT / "tests/fixtures/nvidia_smi/nvidia_smi_nvml_driver_library_mismatch_intel_llvm17614.txt"


def _query(rc: int | None, stdout: str, stderr: str = "") -> dict[str, Any]:
    return {
        "nvidia": {
            "nvml": None,
            "smi_fields": SMI_FIELDS,
            "smi_query": {"argv": ["nvidia-smi"], "rc": rc, "stdout": stdout, "stderr": stderr, "error": None},
        }
    }


def test_the_drivers_part_reads_the_driver_version_the_hardware_part_read() -> None:
    """nvidia-smi once per probe: what ``--query-gpu=driver_version`` would say, from the
    hardware part's answer, gives the drivers part the same ``nvml`` as asking again."""
    rows = "".join(f"{i}, NVIDIA B300, GPU-{i}, 274877, 00000000:{i:02X}:00.0, 580.95.05, 10.0\n" for i in range(8))
    read = driver_probe.driver_version_read(_query(0, rows))
    assert read == (0, "580.95.05\n" * 8, "")
    assert driver_probe._nvml(*read) == {"version": "580.95.05"}
    # NVML answered instead of nvidia-smi
    nvml = {"nvidia": {"nvml": {"driver_version": "580.95.05", "devices": []}, "smi_query": None}}
    from_nvml = driver_probe.driver_version_read(nvml)
    assert from_nvml is not None
    assert driver_probe._nvml(*from_nvml) == {"version": "580.95.05"}
    # nvidia-smi failing says why, as it would have to the drivers part
    said = MISMATCH.read_text().splitlines()[1]
    failed = driver_probe.driver_version_read(_query(18, said + "\n"))
    assert failed is not None
    assert driver_probe._nvml(*failed) == {"error": "Failed to initialize NVML: Driver/library version mismatch"}
    # read nothing (no nvidia-smi, timed out, a row it cannot split): the drivers part asks itself
    assert driver_probe.driver_version_read({"nvidia": {"nvml": None, "smi_query": None}}) is None
    assert driver_probe.driver_version_read(_query(None, "", "timed out after 3 s")) is None
    assert driver_probe.driver_version_read(_query(0, "0, a, b\n")) is None


def test_a_unit_restarted_by_the_deploy_is_verified_only_once_a_smoke_test_since_found_it_serving(
    tmp_path: Path,
) -> None:
    """The applied marker is written right after the deploy (re)starts a unit, the ``.restarts``
    file once a smoke test finds it serving: a converge that stopped between the two left the unit
    still starting, which the next converge waits for."""
    marker = tmp_path / "kimi-vllm"
    marker.write_text("digest\n")
    assert state_probe._restarts_verified(str(marker)) == (False, 0, None)  # never smoke-tested
    done = tmp_path / "kimi-vllm.restarts"
    done.write_text("2\n")  # a first start: no time without service
    os.utime(marker, ns=(1_000_000_000, 1_000_000_000))
    os.utime(done, ns=(2_000_000_000, 2_000_000_000))
    assert state_probe._restarts_verified(str(marker)) == (True, 2, None)
    done.write_text("2 41.5\n")  # a restart: 41.5 s from its stop to the smoke test's answer
    os.utime(done, ns=(2_000_000_000, 2_000_000_000))
    assert state_probe._restarts_verified(str(marker)) == (True, 2, 41.5)
    done.write_text("2 lots\n")
    os.utime(done, ns=(2_000_000_000, 2_000_000_000))
    assert state_probe._restarts_verified(str(marker)) == (True, 2, None)
    # restarted again by a converge that stopped before its smoke test: the check is older
    os.utime(marker, ns=(3_000_000_000, 3_000_000_000))
    assert state_probe._restarts_verified(str(marker)) == (False, 0, None)


def test_the_engines_a_stopped_drain_left_out_of_the_router_are_read_only_when_asked(tmp_path: Path) -> None:
    """hostside/router_drain.py records the engines it took out until it puts them back; the probe
    of a router host that drains reads them (bounded, a list of strings or nothing)."""
    path = tmp_path / "router-drained.json"
    assert state_probe._router_drained(True, str(path)) == []
    path.write_text('["http://10.0.7.2:8000", 7, {"x": 1}]')
    assert state_probe._router_drained(True, str(path)) == ["http://10.0.7.2:8000"]
    assert state_probe._router_drained(False, str(path)) == []
    path.write_text('{"urls": ["http://10.0.7.2:8000"]}')
    assert state_probe._router_drained(True, str(path)) == []
    path.write_text('["http://10.0.7.2:8000"' + " " * 100)
    assert state_probe._router_drained(True, str(path)) == []


def test_the_release_log_is_read_from_its_end_within_a_bound(tmp_path: Path) -> None:
    """A release log grown past the probe's bound: its last entries are read whole, the line the
    bounded read began inside of left out."""
    log = tmp_path / "releases.log"
    log.write_text(
        "".join(f"2026-12-06T00:00:{i % 60:02d}Z /opt/kimi/releases/r{i} serving run{i}\n" for i in range(5000))
    )
    entries = state_probe._release_log(str(log), most=4096)
    assert entries[-1] == ["2026-12-06T00:00:19Z", "/opt/kimi/releases/r4999", "serving", "run4999"]
    assert all(e[1].startswith("/opt/kimi/releases/r") and e[2] == "serving" for e in entries)
    assert 0 < len(entries) < 4096 // 50
