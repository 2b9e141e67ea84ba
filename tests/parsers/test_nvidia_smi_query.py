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
        ("query_error_no_devices_rtx5090_ogkm862.txt", "no_devices"),
        ("query_error_device_handle_unknown_p4_synonv22.txt", "device_handle_error"),
        ("query_error_device_handle_unknown_space_nvdocker1553.txt", "device_handle_error"),
        ("query_error_nvml_insufficient_permissions_470_nvdocker1608.txt", "nvml_init_failed"),
        ("query_error_nvml_unknown_error_510_nvdocker1671.txt", "nvml_init_failed"),
        ("query_error_gpu_lost_marian251.txt", "gpu_lost"),
        ("query_error_gpu_lost_wrapped_windows_darknet86.txt", "gpu_lost"),
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


# Every field nvidia_gpu_exporter queries, with units, from real drivers 465 to 610 (SOURCES.md):
# headers of 115 to 241 names, some not lowercase (pci.baseClass, encoder.stats.sessionCount).
ALL_FIELDS = {
    "query_rtx2080s_allfields_465_nvgpuexp.csv": (115, "NVIDIA GeForce RTX 2080 SUPER", "465.27"),
    "query_rtx2080s_win_wddm_allfields_466_nvgpuexp.csv": (115, "NVIDIA GeForce RTX 2080 SUPER", "466.63"),
    "query_h100sxm_allfields_load_590_nvgpuexp.csv": (212, "NVIDIA H100 80GB HBM3", "590.48.01"),
    "query_h100sxm_mig_allfields_util_na_590_nvgpuexp.csv": (212, "NVIDIA H100 80GB HBM3", "590.48.01"),
    "query_h200_allfields_header_units_590_nvgpuexp.csv": (212, "NVIDIA H200", "590.48.01"),
    "query_h200_mig_allfields_load_590_nvgpuexp.csv": (212, "NVIDIA H200", "590.48.01"),
    "query_rtx2080s_win_wddm_allfields_591_nvgpuexp.csv": (210, "NVIDIA GeForce RTX 2080 SUPER", "591.86"),
    "query_l40s_allfields_595_nvgpuexp.csv": (202, "NVIDIA L40S", "595.80"),
    "query_rtx4080s_allfields_load_595_nvgpuexp.csv": (202, "NVIDIA GeForce RTX 4080 SUPER", "595.71.05"),
    "query_rtx2080s_allfields_610_nvgpuexp.csv": (241, "NVIDIA GeForce RTX 2080 SUPER", "610.57.04"),
    "query_rtx2080s_win_funcnotfound_allfields_610_nvgpuexp.csv": (239, "NVIDIA GeForce RTX 2080 SUPER", "610.62"),
}


@pytest.mark.parametrize("name", sorted(ALL_FIELDS))
def test_a_header_of_every_field_is_read_as_the_header(name: str) -> None:
    count, gpu, driver = ALL_FIELDS[name]
    [values] = parse_query(fixture(name))
    assert (len(values), values["name"], values["driver_version"]) == (count, gpu, driver)
    assert "timestamp" in values
    assert isinstance(values["memory.total"], int)
    # The header's own names are the keys, mixed case kept: no name read as a value.
    header = fixture(name).splitlines()[0]
    assert list(values) == [cell.strip().split(" [")[0] for cell in header.split(",")]


def test_fabric_and_mig_fields_of_a_hopper_host_on_590() -> None:
    [h200] = parse_query(fixture("query_h200_mig_allfields_load_590_nvgpuexp.csv"))
    assert (h200["fabric.state"], h200["fabric.status"], h200["mig.mode.current"]) == (
        "Completed",
        "Success",
        "Enabled",
    )
    assert (h200["memory.total"], h200["pci.baseClass"], h200["encoder.stats.sessionCount"]) == (143771, "0x3", 0)
    # MIG on: whole-GPU utilization is not reported, and that is None, not 0.
    assert h200["utilization.gpu"] is None


def test_a_header_is_found_with_or_without_units_in_any_subset_and_order() -> None:
    header = fixture("query_h200_allfields_header_units_590_nvgpuexp.csv").splitlines()[0]
    names = [cell.strip() for cell in header.split(",")]
    [full] = parse_query(fixture("query_h200_allfields_header_units_590_nvgpuexp.csv"))
    values = fixture("query_h200_allfields_header_units_590_nvgpuexp.csv").splitlines()[1].split(",")
    for picked in ([40, 3, 17], [17, 3], [5]):
        text = ", ".join(names[i] for i in picked) + "\n" + ", ".join(values[i].strip() for i in picked) + "\n"
        keys = [names[i].split(" [")[0] for i in picked]
        assert parse_query(text) == [{key: full[key] for key in keys}]
        nounits = ", ".join(keys) + "\n" + ", ".join(values[i].strip() for i in picked) + "\n"
        assert list(parse_query(nounits)[0]) == keys


def test_a_field_name_no_driver_documents_yet_is_kept() -> None:
    text = "name, memory.total [MiB], fabric.futureField\nNVIDIA H200, 143771 MiB, Ready\n"
    assert parse_query(text) == [{"name": "NVIDIA H200", "memory.total": 143771, "fabric.futureField": "Ready"}]


def test_the_query_field_list_does_not_turn_a_header_into_a_gpu() -> None:
    text = fixture("query_h200_allfields_header_units_590_nvgpuexp.csv")
    fields = [cell.strip().split(" [")[0] for cell in text.splitlines()[0].split(",")]
    assert parse_query(text, fields) == parse_query(text)


def test_a_gpu_line_of_words_is_data_not_a_header() -> None:
    # Values that all look like names ("Enabled", "Default") are a GPU's, with the field list given.
    assert parse_query("Enabled, Default\n", ["mig.mode.current", "compute_mode"]) == [
        {"mig.mode.current": "Enabled", "compute_mode": "Default"}
    ]
    with pytest.raises(ParseError, match="pass the query's field list"):
        parse_query("Enabled, Default\n")


def test_a_header_without_gpu_lines_is_refused() -> None:
    header = fixture("query_h200x8_header_units_distributedai.csv").splitlines()[0]
    with pytest.raises(ParseError, match="a header of 4 fields and no GPU line after it"):
        parse_query(header + "\n")


def test_a_value_the_driver_lacks_is_none() -> None:
    [gpu] = parse_query(fixture("query_rtx2080s_win_funcnotfound_allfields_610_nvgpuexp.csv"))
    missing = [key for key, value in gpu.items() if value is None]
    assert missing
    assert "name" not in missing
    [old] = parse_query(fixture("query_rtx2080ti_nounits_unknown_error_442_mindminer627.csv"))
    assert None in old.values()


def test_a_gpu_that_fell_off_the_bus_is_its_own_failure_with_the_line_printed() -> None:
    # the reboot hint is what tells a user this is not a driver install problem
    with pytest.raises(NvidiaSmiFailure) as error:
        parse_query(fixture("query_error_gpu_lost_marian251.txt"))
    assert error.value.failure == {
        "kind": "gpu_lost",
        "message": "Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU",
    }
    # a Windows console wrapped the line: the first half is still read as the GPU being lost
    failure = find_failure(fixture("query_error_gpu_lost_wrapped_windows_darknet86.txt"))
    assert failure is not None
    assert (failure["kind"], failure["message"]) == (
        "gpu_lost",
        "Unable to determine the device handle for GPU 0000:03:00.0: GPU is lost.  Reboot",
    )


def test_an_ampere_geforce_row_keeps_its_identifiers_as_strings() -> None:
    assert parse_query(fixture("query_rtx3080_header_units_550_miningrigmonitor.csv")) == [
        {
            "name": "NVIDIA GeForce RTX 3080",
            "driver_version": "550.90.07",
            "vbios_version": "94.02.71.40.66",
            "pci.bus_id": "00000000:05:00.0",
            "memory.total": 10240,
        }
    ]
