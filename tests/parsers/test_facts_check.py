"""``kimi-deploy facts check``: a deploy's preflight gates on outputs captured on a host.

What an operator pastes when a host failed a gate (or before it joins the inventory) is judged by the
gate a deploy would run there: exit 0 and an ``ok:`` line per gate that passes, exit 1 and the gate's
own line for one that refuses, exit 2 and one line naming the file for a capture that is not its
command's output.
"""

from __future__ import annotations

import pytest

from tests.cli_run import kimi
from tests.conftest import ROOT
from tests.parsers import FIXTURES

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

RECIPE = str(ROOT / "recipes" / "kimi-k3.1-pro.yaml")
INVENTORY = str(ROOT / "inventories" / "prod.py")


def _check(host: str, *captures: str) -> tuple[int, str, str]:
    run = kimi("facts", "check", RECIPE, INVENTORY, host, *captures)
    return run.returncode, run.stdout, run.stderr


def test_a_host_whose_gpus_are_not_the_pools_is_refused_with_the_gates_line() -> None:
    code, out, err = _check(
        "b300-01", "--nvidia-smi-query", str(FIXTURES / "query_h200x8_header_units_distributedai.csv")
    )
    assert (code, out) == (1, "")
    assert err == (
        "kimi-deploy: b300-01: accelerators: pool serve needs 8 x B300 with >= 260 GiB, found 8 x NVIDIA H200 (140 GiB)\n"
    )


def test_nvidia_smi_failing_is_the_hosts_error() -> None:
    code, _, err = _check(
        "b300-01", "--nvidia-smi-query", str(FIXTURES / "query_error_nvml_mismatch_intel_llvm17614.txt")
    )
    assert code == 1
    assert err.endswith("found an error: Failed to initialize NVML: Driver/library version mismatch\n")


def test_an_hca_with_its_port_down_is_named_and_the_rest_pass() -> None:
    """gb300-p01 asks mlx5_0..mlx5_3 for KV transfer; in this capture mlx5_2's port is Down."""
    code, out, err = _check("gb300-p01", "--ibstat", str(FIXTURES / "ibstat_h100_mixed_ib_eth_3_down_gpud.txt"))
    assert (code, out) == (1, "")
    assert err == "kimi-deploy: gb300-p01: RDMA: mlx5_2 needs an ACTIVE port for KV transfer, found DOWN\n"


def test_a_host_whose_hcas_are_all_active_passes_and_says_what_it_found() -> None:
    path = FIXTURES / "ibv_devinfo_cx7_12hca_roce_2_down_tabs_slurmv4.txt"
    code, out, err = _check("gb300-p01", "--ibv-devinfo", str(path))
    assert (code, err) == (0, "")
    assert out.startswith("ok: gb300-p01: RDMA: mlx5_0, mlx5_1, mlx5_2, mlx5_3 asked for KV transfer, ACTIVE ports: ")
    assert "mlx5_0/1" in out
    assert out.count("\n") == 1


def test_a_topology_without_rdma_asks_nothing_of_the_hcas() -> None:
    path = FIXTURES / "ibstat_h100_mixed_ib_eth_3_down_gpud.txt"
    code, out, _ = _check("b300-01", "--ibstat", str(path))
    assert code == 0
    assert out == "ok: b300-01: RDMA: topology single-node moves no KV cache over RDMA from this host: nothing asked\n"


def test_tpu_chips_of_another_generation_are_refused() -> None:
    code, _, err = _check("tpu7x-w0", "--tpu-pci", str(FIXTURES / "tpu_v6e_vfio_sysfs_ray65105.txt"))
    assert code == 1
    assert err == "kimi-deploy: tpu7x-w0: accelerators: pool serve needs 4 x TPU7x with >= 178 GiB, found 4 x TPU v6e\n"


def test_two_gates_at_once_each_say_their_verdict() -> None:
    code, out, err = _check(
        "gb300-p01",
        "--nvidia-smi-query",
        str(FIXTURES / "query_b200_header_units_clocks_pytorchao4002.csv"),
        "--ibv-devinfo",
        str(FIXTURES / "ibv_devinfo_cx7_12hca_roce_2_down_tabs_slurmv4.txt"),
    )
    assert code == 1
    assert err.startswith("kimi-deploy: gb300-p01: accelerators: pool prefill needs 4 x GB300 with >= 260 GiB, found ")
    assert out.startswith("ok: gb300-p01: RDMA: ")


@pytest.mark.parametrize(
    ("host", "args", "said"),
    [
        (
            "b300-01",
            [],
            "inventories/prod.py: b300-01: give a capture: --nvidia-smi-query, --tpu-pci, --ibv-devinfo, "
            "--ibstat, --nccl-all-reduce",
        ),
        ("nohost", ["--ibstat", "x"], "inventories/prod.py: nohost: not a host of the plan"),
        (
            "b300-01",
            ["--ibstat", "x", "--ibv-devinfo", "y"],
            "inventories/prod.py: b300-01: one capture per probe section: --ibv-devinfo or --ibstat",
        ),
        (
            "b300-01",
            ["--ibstat", "x", "--fields", "name"],
            "inventories/prod.py: b300-01: --fields applies to --nvidia-smi-query only",
        ),
        ("b300-01", ["--ibstat", "no/such/capture.txt"], "no/such/capture.txt: ibstat: No such file or directory"),
    ],
)
def test_a_wrong_call_is_one_line_and_exit_2(host: str, args: list[str], said: str) -> None:
    code, out, err = _check(host, *args)
    assert (code, out) == (2, "")
    assert err.endswith(said + "\n")
    assert err.count("\n") == 1


def test_a_capture_of_another_command_is_one_line_naming_the_file() -> None:
    path = str(FIXTURES / "topo_h20x8_8nic_tabs_sglang24966.txt")
    code, _, err = _check("b300-01", "--nvidia-smi-query", path)
    assert code == 2
    assert err.startswith(f"{path}: nvidia-smi-query: no header line (")
    assert err.count("\n") == 1


def test_a_tpu_listing_without_pci_ids_says_which_listing_the_gate_reads() -> None:
    path = str(FIXTURES / "tpu_v3_4chip_ls_accel_plain_tpustarter.txt")
    code, _, err = _check("tpu7x-w0", "--tpu-pci", path)
    assert code == 2
    assert err == (
        f"{path}: tpu-pci: shows 4 TPU chips without their PCI ids: the gate judges a listing with them "
        "(lspci -nn, or sysfs's vendor and device files)\n"
    )


def test_an_all_reduce_capture_is_judged_by_the_topologys_floor() -> None:
    good = FIXTURES / "nccl_allreduce_h100_2node_16rank_good_nvls_ompi_noise_nccltests309.txt"
    code, out, _ = _check("b300-01", "--nccl-all-reduce", str(good))
    assert (code, out) == (0, "ok: b300-01: all-reduce: 469.1 GB/s at 16 GiB over 16 ranks, needs >= 370 GB/s\n")
    slow = FIXTURES / "nccl_allreduce_gh200_2node_8rank_slow_nocxi_v2171_indented_cscs.txt"
    code, _, err = _check("b300-01", "--nccl-all-reduce", str(slow))
    assert (code, err) == (
        1,
        "kimi-deploy: b300-01: all-reduce: all_reduce_perf: bus bandwidth 5.41 GB/s at 128 MiB (in-place), "
        "needs >= 370 GB/s\n",
    )
    # a topology that sets no all-reduce check asks nothing of it
    code, out, _ = _check("gb300-p01", "--nccl-all-reduce", str(slow))
    assert (code, out) == (
        0,
        "ok: gb300-p01: all-reduce: topology gb300-pd sets no comm_check.all_reduce: nothing asked\n",
    )


def test_a_run_of_another_collective_is_not_judged_as_an_all_reduce() -> None:
    path = str(FIXTURES / "nccl_alltoall_rtx5090x1_inplace_na_nccltests287.txt")
    code, _, err = _check("b300-01", "--nccl-all-reduce", path)
    assert code == 2
    assert err == (
        f"{path}: nccl-all-reduce: its rows reduce nothing (redop none): a run of another collective than "
        "all_reduce_perf\n"
    )
