"""``nvidia-smi --query-gpu ... --format=csv`` and its failure texts, from real machines."""

from __future__ import annotations

import pytest

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.nvidia_smi_query import NvidiaSmiFailure, find_failure, parse_query
from tests.parsers import fixture


def test_h200_header_with_units_gives_memory_in_mib_as_int() -> None:
    gpus = parse_query(fixture("query_h200x8_header_units_distributedai.csv"))
    assert len(gpus) == 8
    assert gpus[0] == {"name": "NVIDIA H200", "memory.total": 143771, "pcie.link.gen.max": 5, "pcie.link.width.max": 16}
    assert all(gpu == gpus[0] for gpu in gpus)


def test_fields_without_units_keep_identifiers_as_strings() -> None:
    gpus = parse_query(fixture("query_rtx6000x8_header_pcie_andyub.csv"))
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert gpus[2] == {
        "index": 2,
        "name": "Quadro RTX 6000",
        "pci.bus_id": "00000000:1F:00.0",
        "pcie.link.gen.current": 1,
        "pcie.link.gen.max": 3,
        "pcie.link.width.current": 16,
        "pcie.link.width.max": 16,
    }


def test_values_the_gpu_cannot_report_are_none_not_zero() -> None:
    # DGX Spark (GB10): unified memory, nvidia-smi reports no framebuffer.
    assert parse_query(fixture("query_gb10_na_header_units_unsloth10703.csv")) == [
        {"index": 0, "name": "NVIDIA GB10", "memory.total": None, "memory.free": None}
    ]
    assert parse_query(fixture("query_gb10_na_memory_only_unsloth10283.csv")) == [
        {"memory.free": None, "memory.total": None, "memory.used": None}
    ]


def test_noheader_output_is_keyed_by_the_callers_field_list() -> None:
    assert parse_query(fixture("query_h100nvl_noheader_akash91.csv"), ["name", "pci.device_id"]) == [
        {"name": "NVIDIA H100 NVL", "pci.device_id": "0x232110DE"}
    ]
    fields = ["memory.used", "memory.total", "utilization.memory"]
    assert parse_query(fixture("query_gb10_noheader_nounits_llamaswap782.csv"), fields) == [
        {"memory.used": None, "memory.total": None, "utilization.memory": 0}
    ]


def test_noheader_output_without_a_field_list_is_refused() -> None:
    with pytest.raises(ParseError, match="pass the query's field list"):
        parse_query(fixture("query_h100nvl_noheader_akash91.csv"))


def test_a_field_list_of_another_length_is_refused() -> None:
    with pytest.raises(ParseError, match="1 values for 3 fields"):
        parse_query(fixture("query_h100nvl_noheader_akash91.csv").replace(", ", " "), ["a", "b", "c"])
    with pytest.raises(ParseError, match="the header has 4 fields, the query 2"):
        parse_query(fixture("query_h200x8_header_units_distributedai.csv"), ["name", "memory.total"])


def test_crlf_and_padding_do_not_change_values() -> None:
    text = fixture("query_h200x8_header_units_distributedai.csv")
    expected = parse_query(text)
    assert parse_query(text.replace("\n", "\r\n")) == expected
    assert parse_query(text.replace(", ", " ,  ")) == expected


def test_driver_library_mismatch_raises_with_the_nvml_version() -> None:
    text = fixture("query_error_nvml_mismatch_intel_llvm17614.txt")
    with pytest.raises(NvidiaSmiFailure) as error:
        parse_query(text)
    assert error.value.failure == {
        "kind": "driver_library_mismatch",
        "message": "Failed to initialize NVML: Driver/library version mismatch",
        "nvml_library_version": "550.144",
    }
    assert str(error.value) == (
        "nvidia-smi failed: Failed to initialize NVML: Driver/library version mismatch (NVML library version 550.144)"
    )
    assert isinstance(error.value, ParseError)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("query_error_driver_unreachable_gcp33.txt", "driver_unreachable"),
        ("query_error_no_devices_genv.txt", "no_devices"),
        ("query_error_nvml_mismatch_intel_llvm17614.txt", "driver_library_mismatch"),
    ],
)
def test_failure_texts_are_recognised_as_data(name: str, kind: str) -> None:
    failure = find_failure(fixture(name))
    assert failure is not None
    assert failure["kind"] == kind
    with pytest.raises(NvidiaSmiFailure):
        parse_query(fixture(name), ["name"])


def test_a_table_is_not_a_failure() -> None:
    assert find_failure(fixture("query_h200x8_header_units_distributedai.csv")) is None


@pytest.mark.parametrize("name", ["topo_gb200x4_8nic_spaces_rhel4nv.txt", "ibstat_h100_mixed_ib_eth_3_down_gpud.txt"])
def test_other_outputs_are_refused(name: str) -> None:
    with pytest.raises(ParseError):
        parse_query(fixture(name))
