"""``kimi-deploy facts parse``: a captured output in, JSON out, or one line naming the file and kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.cli_run import kimi
from tests.parsers import FIXTURES

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def test_h200_topology_as_sorted_indented_json() -> None:
    path = str(FIXTURES / "topo_h200x8_12nic_tabs_distributedai.txt")
    run = kimi("facts", "parse", "--kind", "nvidia-smi-topo", path)
    assert run.returncode == 0, run.stderr
    topo = json.loads(run.stdout)
    assert len(topo["gpus"]) == 8
    assert len(topo["nics"]) == 12
    assert topo["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert topo["gpus"][0]["cpu_affinity"] == "0-55,112-167"
    assert run.stdout == json.dumps(topo, indent=2, sort_keys=True) + "\n"
    assert run.stderr == ""


@pytest.mark.parametrize(
    ("kind", "name", "extra", "check"),
    [
        (
            "nvidia-smi-query",
            "query_h200x8_header_units_distributedai.csv",
            [],
            lambda d: d[0]["memory.total"] == 143771,
        ),
        (
            "nvidia-smi-query",
            "query_h100nvl_noheader_akash91.csv",
            ["--fields", "name,pci.device_id"],
            lambda d: d == [{"name": "NVIDIA H100 NVL", "pci.device_id": "0x232110DE"}],
        ),
        ("ibv-devinfo", "ibv_devinfo_cx6_1hca_ib_tabs_ucx9914.txt", [], lambda d: d[0]["ports"][0]["port_lid"] == 386),
        (
            "ibstat",
            "ibstat_a100_8ca_ibpanic_exit255_gpud.txt",
            [],
            lambda d: len(d["cas"]) == 8 and len(d["errors"]) == 1,
        ),
        ("tpu-pci", "tpu_v6e_vfio_sysfs_ray65105.txt", [], lambda d: d["generation"] == "v6e" and d["chip_count"] == 4),
        (
            "nvidia-smi-fabric",
            "fabric_gbfamily_completed_insufficientresources_azhpc506.txt",
            [],
            lambda d: d[0]["status"] == "Insufficient Resources" and d[0]["ready"] is False,
        ),
        (
            "nccl-all-reduce",
            "nccl_allreduce_h100_2node_16rank_good_nvls_ompi_noise_nccltests309.txt",
            [],
            lambda d: len(d["ranks"]) == 16 and d["rows"][-1]["in_place"]["busbw_gbs"] == 469.1,
        ),
    ],
)
def test_each_kind_prints_its_json(kind: str, name: str, extra: list[str], check: Callable[[Any], bool]) -> None:
    run = kimi("facts", "parse", "--kind", kind, *extra, str(FIXTURES / name))
    assert run.returncode == 0, run.stderr
    assert check(json.loads(run.stdout))


def test_nvidia_smi_failure_is_one_line_naming_file_and_kind() -> None:
    path = str(FIXTURES / "query_error_nvml_mismatch_intel_llvm17614.txt")
    run = kimi("facts", "parse", "--kind", "nvidia-smi-query", path)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr == (
        f"{path}: nvidia-smi-query: nvidia-smi failed: Failed to initialize NVML: Driver/library version mismatch"
        " (NVML library version 550.144)\n"
    )


def test_output_of_another_kind_is_one_line_and_exit_2() -> None:
    path = str(FIXTURES / "ibstat_h100_mixed_ib_eth_3_down_gpud.txt")
    run = kimi("facts", "parse", "--kind", "nvidia-smi-topo", path)
    assert run.returncode == 2
    assert run.stderr == f"{path}: nvidia-smi-topo: no header line naming the GPU columns (GPU0 ...)\n"


def test_missing_file_is_one_line_and_exit_2() -> None:
    run = kimi("facts", "parse", "--kind", "ibstat", "no/such/capture.txt")
    assert run.returncode == 2
    assert run.stderr == "no/such/capture.txt: ibstat: No such file or directory\n"


def test_fields_belong_to_the_query_kind_only() -> None:
    path = str(FIXTURES / "ibstat_h100_mixed_ib_eth_3_down_gpud.txt")
    run = kimi("facts", "parse", "--kind", "ibstat", "--fields", "name", path)
    assert run.returncode == 2
    assert run.stderr == f"{path}: ibstat: --fields applies to nvidia-smi-query only\n"


def test_nccl_output_that_is_not_nccl_tests_is_one_line_and_exit_2() -> None:
    path = str(FIXTURES / "ibstat_h100_mixed_ib_eth_3_down_gpud.txt")
    run = kimi("facts", "parse", "--kind", "nccl-all-reduce", path)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith(f"{path}: nccl-all-reduce: no nccl-tests output: ")
    assert run.stderr.count("\n") == 1
