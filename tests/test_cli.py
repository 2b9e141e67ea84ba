"""The ``kimi-deploy`` command as a user runs it: a subprocess from the repository root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.weights.lockfile import lock_path
from tests.cli_run import kimi
from tests.conftest import PROD, RECIPE, ROOT
from tests.locked_site import API_KEY_ENV, locked_site

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def test_plan_gb300_pd_prints_every_host_with_pool_rank_ports_and_argv() -> None:
    run = kimi("plan", RECIPE, PROD, "--topology", "gb300-pd")
    assert run.returncode == 0, run.stderr
    rows = {line.split()[0]: line.split() for line in run.stdout.splitlines()[2:13]}
    assert sorted(rows) == sorted(
        [f"gb300-p0{i}" for i in range(1, 7)] + [f"gb300-d0{i}" for i in range(1, 5)] + ["gb300-rt01"]
    )
    assert rows["gb300-d02"][1:6] == ["10.41.0.32", "decode", "worker", "0", "1/4"]
    assert "dp_rpc=13345" in rows["gb300-d01"]
    assert "router=8000" in rows["gb300-rt01"]
    argv_lines = [line for line in run.stdout.splitlines() if line.startswith("  gb300-d03 kimi-vllm: ")]
    assert len(argv_lines) == 1
    assert "--data-parallel-start-rank 8" in argv_lines[0]
    assert "tpu7x" not in run.stdout


@pytest.mark.parametrize(
    ("topology", "hosts", "needle"),
    [
        ("single-node", ["b300-01"], "--tensor-parallel-size 8"),
        ("tpu7x", [f"tpu7x-w{i}" for i in range(8)], "-m sgl_jax.launch_server"),
    ],
)
def test_plan_other_reference_topologies(topology: str, hosts: list[str], needle: str) -> None:
    run = kimi("plan", RECIPE, PROD, "--topology", topology)
    assert run.returncode == 0, run.stderr
    for host in hosts:
        assert f"  {host} kimi-" in run.stdout
    assert needle in run.stdout


def test_plan_json_is_the_full_spec() -> None:
    run = kimi("plan", RECIPE, PROD, "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert len(data["hosts"]) == 23
    d2 = next(h for h in data["hosts"] if h["host"] == "gb300-d02")
    assert (d2["pool"], d2["node_rank"], d2["dp_start_rank"], d2["leader"]) == ("decode", 1, 4, "gb300-d01")
    assert d2["units"][0]["argv"][:2] == [
        "/opt/kimi/engines/vllm-0.33.0+fastsafetensors-0.5.0+mooncake-transfer-engine-cuda13-0.3.13.post1+nixl-1.5.1/bin/vllm",
        "serve",
    ]


def test_render_writes_each_hosts_files_and_no_secret(tmp_path: Path) -> None:
    run = kimi("plan", RECIPE, PROD, "--topology", "gb300-pd", "--render", str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "gb300-d01/etc/systemd/system/kimi-vllm.service").is_file()
    assert (tmp_path / "gb300-rt01/etc/systemd/system/kimi-mooncake-master.service").is_file()
    assert not list(tmp_path.rglob("secrets"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"gb300-p0{i}" for i in range(1, 7)] + [f"gb300-d0{i}" for i in range(1, 5)] + ["gb300-rt01"]
    )


def test_validate_refuses_the_topology_no_engine_release_serves_and_passes_the_others(tmp_path: Path) -> None:
    site = locked_site(tmp_path)
    run = kimi("validate", RECIPE, PROD, cwd=site, env=API_KEY_ENV)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [
        f"{RECIPE}: topologies.tpu7x: sglang-jax 0.1.0rc0 does not register KimiK3ForConditionalGeneration "
        "(registers KimiK25ForConditionalGeneration, KimiLinearForCausalLM, DeepseekV3ForCausalLM, "
        "DeepseekV2ForCausalLM); served on nvidia by vllm 0.33.0, tokenspeed 0.1.1",
    ]
    for name, hosts in (("single-node", "1 host"), ("gb300-pd", "11 hosts"), ("tokenspeed-multi", "2 hosts")):
        run = kimi("validate", RECIPE, PROD, "--topology", name, cwd=site, env=API_KEY_ENV)
        assert (run.returncode, run.stderr) == (0, "")
        assert run.stdout == f"ok: {RECIPE} x {PROD}: {hosts} in {name}\n"


def test_validate_refuses_what_the_converge_would_before_connecting_each_in_one_line(tmp_path: Path) -> None:
    """No lock for a checkpoint the placed topologies hold, an API key the controller cannot
    read: each is a line, as the converge would stop on it."""
    run = kimi("validate", RECIPE, PROD, "--topology", "gb300-pd", env={"KIMI_API_KEY": ""})
    assert (run.returncode, run.stdout) == (2, "")
    recipe = load_recipe(RECIPE)
    model = recipe.model
    assert run.stderr.splitlines() == [
        *(
            f"{lock_path(c)}: no lock for {c.repo}@{c.revision}: run `kimi-deploy lock {RECIPE}`"
            for _, c in recipe.checkpoints("gb300-pd")
        ),
        f"{RECIPE}: topologies.gb300-pd.expose.api_key: environment variable KIMI_API_KEY is not set on the controller",
    ]
    site = locked_site(tmp_path)
    lock = site / lock_path(model)
    lock.write_text(lock.read_text(encoding="utf-8").replace(model.revision, "0" * 40), encoding="utf-8")
    run = kimi("validate", RECIPE, PROD, "--topology", "gb300-pd", cwd=site, env=API_KEY_ENV)
    assert (run.returncode, run.stderr) == (2, f"{lock_path(model)}: repo: lock is for '{model.repo}'@'{'0' * 40}'\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("validate", "recipes/nope.yaml", PROD),
            "recipes/nope.yaml: cannot read: No such file or directory",
        ),
        (("validate", RECIPE, "inventories/nope.py"), "inventories/nope.py: no such inventory file"),
        (
            ("plan", RECIPE, PROD, "--topology", "gb200"),
            "inventories/prod.py: topology 'gb200' is not in the recipe "
            "(known: single-node, gb300-pd, tpu7x, tokenspeed-single, tokenspeed-multi)",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], line: str) -> None:
    run = kimi(*args)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [line]


def test_plan_says_what_gates_an_engine_start() -> None:
    run = kimi("plan", RECIPE, PROD)
    assert run.returncode == 0, run.stderr
    gates = {}
    topology = ""
    for line in run.stdout.splitlines():
        if line.startswith("topology "):
            topology = line.split()[1].rstrip(":")
        if line.startswith("  before start: "):
            gates[topology] = line.removeprefix("  before start: ")
    assert gates == {
        "single-node": "all-reduce per instance (nccl, 8 ranks), busbw >= 370 GB/s at 1 GiB",
        "gb300-pd": "communication check (every port between hosts and 2 of each host's ephemeral range, >= 1000 Mbit/s)",
        "tpu7x": "communication check (every port between hosts and 2 of each host's ephemeral range, >= 1000 Mbit/s)",
        "tokenspeed-multi": "communication check (every port between hosts and 2 of each host's ephemeral range, >= 1000 Mbit/s); "
        "then all-reduce per instance (nccl, 16 ranks), busbw >= 300 GB/s at 1 GiB",
    }


def test_plan_lists_the_drivers_of_each_kind_of_host() -> None:
    """HGX boards get the fabric manager, B300 boards the NVLink subnet manager with it; Grace Blackwell trays, which have no NVSwitch, get IMEX with
    its node list and channel instead; TPU hosts get their kernel setting."""
    run = kimi("plan", RECIPE, PROD)
    assert run.returncode == 0, run.stderr
    drivers: dict[str, list[str]] = {}
    topology = ""
    for line in run.stdout.splitlines():
        if line.startswith("topology "):
            topology = line.split()[1].rstrip(":")
        if line.startswith("  drivers ("):
            drivers.setdefault(topology, []).append(line.removeprefix("  "))
    # Debian's names, and Ubuntu's where its tree names them otherwise
    driver = "nvidia-driver-cuda nvidia-kernel-open-dkms (Ubuntu: libnvidia-compute-580 nvidia-dkms-580-open)"
    # B300 boards (NVLink 5) get the NVLink subnet manager their fabric manager starts, and its module
    nvlsm = (
        "nvlsm infiniband-diags; services nvidia-fabricmanager; modules ib_umad (/etc/modules-load.d/nvidia-nvlsm.conf)"
    )
    assert drivers == {
        "single-node": [
            f"drivers (b300-01): B300 x8: pin nvidia-driver-pinning-580; packages {driver} nvidia-fabricmanager {nvlsm}"
        ],
        "gb300-pd": [
            f"drivers (gb300-p01 .. gb300-d04, 10 hosts): GB300 x4: pin nvidia-driver-pinning-580; packages {driver} "
            "nvidia-imex; services nvidia-imex-channel nvidia-imex; files /etc/nvidia-imex/nodes_config.cfg, "
            "/etc/modprobe.d/nvidia-imex-channel.conf (options nvidia NVreg_CreateImexChannel0=1), "
            "/etc/systemd/system/nvidia-imex-channel.service"
        ],
        "tpu7x": [
            "drivers (tpu7x-w0 .. tpu7x-w7, 8 hosts): TPU7x: host settings vm.max_map_count = 8388608 "
            "(/etc/sysctl.d/60-kimi-tpu.conf)"
        ],
        "tokenspeed-single": [
            f"drivers (b300-02): B300 x8: pin nvidia-driver-pinning-580; packages {driver} nvidia-fabricmanager {nvlsm}"
        ],
        "tokenspeed-multi": [
            f"drivers (h200-01 .. h200-02, 2 hosts): H200 x8: pin nvidia-driver-pinning-580; packages {driver} "
            "nvidia-fabricmanager; services nvidia-fabricmanager"
        ],
    }


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``kimi-deploy plan ... | head``: no traceback, the exit status a shell gives a tool SIGPIPE ended."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kimi_pyinfra.cli", "plan", RECIPE, PROD, "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()  # the plan (about 70 KB) outgrows the pipe: the command's next write fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""
