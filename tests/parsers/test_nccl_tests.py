"""nccl-tests output from real runs: H100 and GH200 across nodes, RTX 5090 boxes, wrong values and failed runs."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.nccl_tests import (
    NcclTestsRun,
    check_bus_bandwidth,
    format_bytes,
    parse_nccl_tests,
    run_problems,
)
from tests.parsers import FIXTURES, fixture

H100_OMPI = "nccl_allreduce_h100_2node_16rank_good_nvls_ompi_noise_nccltests309.txt"
H100_SRUN = "nccl_allreduce_h100_p5_2node_srun_labels_nofooter_awsome.txt"
GH200_GOOD = "nccl_allreduce_gh200_2node_8rank_good_v2171_indented_cscs.txt"
GH200_SLOW = "nccl_allreduce_gh200_2node_8rank_slow_nocxi_v2171_indented_cscs.txt"
GH200_WRONG = "nccl_allreduce_gh200_2node_2rank_wrong_1mib_v2178_nccltests369.txt"
GH200_BUSY = "nccl_allreduce_gh200_2node_cuda_busy_norows_v2178_nccltests369.txt"
RTX5090_ONE = "nccl_allreduce_rtx5090x1_1rank_busbw0_nccltests287.txt"
RTX5090_FAIL = "nccl_allreduce_rtx5090x2_nccl_failure_debug_info_nccltests287.txt"
RTX5090_FOUR = "nccl_allreduce_rtx5090x4_single_good_nccltests287.txt"
RTX5090_EIGHT = "nccl_allreduce_rtx5090x8_single_good_v2182_nofooter_aikitoria.txt"
ALLTOALL = "nccl_alltoall_rtx5090x1_inplace_na_nccltests287.txt"
ALL = sorted(p.name for p in FIXTURES.glob("nccl_*.txt"))
GiB = 1 << 30
MiB = 1 << 20


def largest(run: NcclTestsRun) -> tuple[float, float]:
    row = max(run["rows"], key=lambda r: r["size_bytes"])
    return row["out_of_place"]["busbw_gbs"], row["in_place"]["busbw_gbs"]


def test_h100_two_nodes_with_open_mpi_warnings_inside_the_device_list() -> None:
    run = parse_nccl_tests(fixture(H100_OMPI))
    assert [r["rank"] for r in run["ranks"]] == list(range(16))
    assert run["ranks"][0] == {
        "rank": 0,
        "group": 0,
        "pid": 29262,
        "host": "bm-h100-01",
        "device": 0,
        "pci_bus": "0000:19:00",
        "gpu": "NVIDIA H100 80GB HBM3",
    }
    assert {r["host"] for r in run["ranks"][8:]} == {"bm-h100-02"}
    assert run["config"] == {
        "threads": 1,
        "gpus_per_thread": 1,
        "min_bytes": 8,
        "max_bytes": 17179869184,
        "step": 2,
        "step_kind": "factor",
        "warmup_iters": 5,
        "iters": 20,
        "agg_iters": 1,
        "validation": 1,
        "graph": 0,
    }
    assert run["nccl_version"] == "2.26.2+cuda12.8"
    assert (run["test"], run["nccl_tests_version"]) == (None, None)
    assert len(run["rows"]) == 32
    assert run["rows"][-1] == {
        "size_bytes": 17179869184,
        "count": 4294967296,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "out_of_place": {"time_us": 68652.0, "algbw_gbs": 250.24, "busbw_gbs": 469.21, "wrong": 0},
        "in_place": {"time_us": 68668.0, "algbw_gbs": 250.19, "busbw_gbs": 469.1, "wrong": 0},
    }
    assert (run["out_of_bounds"], run["avg_busbw_gbs"], run["avg_busbw_verdict"]) == (0, 139.56, None)
    assert run["failures"] == []
    assert run_problems(run) == []


def test_the_check_compares_the_largest_size_not_the_average() -> None:
    run = parse_nccl_tests(fixture(H100_OMPI))
    # The average is dragged down by latency-bound small messages; the 16 GiB plateau is what counts.
    assert run["avg_busbw_gbs"] is not None
    assert run["avg_busbw_gbs"] < 150
    assert check_bus_bandwidth(run, 450) is None
    assert (
        check_bus_bandwidth(run, 470) == "nccl-tests: bus bandwidth 469.1 GB/s at 16 GiB (in-place), needs >= 470 GB/s"
    )


def test_min_bytes_checks_every_size_from_there_up_and_names_the_dip() -> None:
    run = parse_nccl_tests(fixture(GH200_SLOW))
    assert check_bus_bandwidth(run, 5) is None
    assert check_bus_bandwidth(run, 5, min_bytes=16 * MiB) == (
        "all_reduce_perf: bus bandwidth 3.38 GB/s at 32 MiB (out-of-place), needs >= 5 GB/s"
    )
    assert check_bus_bandwidth(run, 100) == (
        "all_reduce_perf: bus bandwidth 5.41 GB/s at 128 MiB (in-place), needs >= 100 GB/s"
    )


def test_gh200_with_slingshot_indented_as_published_and_newest_summary_lines() -> None:
    run = parse_nccl_tests(fixture(GH200_GOOD))
    assert run["test"] == "all_reduce_perf"
    assert [r["host"] for r in run["ranks"]] == ["nid005471"] * 4 + ["nid005487"] * 4
    assert run["ranks"][7]["pci_bus"] == "0039:01:00"
    assert run["ranks"][7]["gpu"] == "NVIDIA GH200 120GB"
    assert run["config"] is not None
    assert (run["config"]["warmup_iters"], run["config"]["max_bytes"]) == (1, 128 * MiB)
    assert len(run["rows"]) == 25
    assert largest(run) == (122.57, 123.11)
    assert (run["out_of_bounds"], run["avg_busbw_gbs"]) == (0, 19.7866)
    assert check_bus_bandwidth(run, 120) is None
    assert check_bus_bandwidth(run, 110, min_bytes=64 * MiB) == (
        "all_reduce_perf: bus bandwidth 107.69 GB/s at 64 MiB (out-of-place), needs >= 110 GB/s"
    )
    assert check_bus_bandwidth(run, 100, min_bytes=GiB) == (
        "all_reduce_perf: no result at 1 GiB or larger to compare with 100 GB/s; the largest message was 128 MiB"
    )


def test_wrong_values_at_one_size_fail_the_check_before_any_bandwidth() -> None:
    run = parse_nccl_tests(fixture(GH200_WRONG))
    assert (run["nccl_tests_version"], run["nccl_version"]) == ("2.17.8", "2.29.2")
    wrong = [r for r in run["rows"] if r["in_place"]["wrong"]]
    assert [(r["size_bytes"], r["out_of_place"], r["in_place"]["wrong"]) for r in wrong] == [
        (1048576, {"time_us": 477.32, "algbw_gbs": 2.2, "busbw_gbs": 2.2, "wrong": 96}, 32)
    ]
    assert (run["out_of_bounds"], run["avg_busbw_gbs"]) == (4, 4.79995)
    assert run["failures"] == [
        ".. gpu-1-1 pid 662195: Test failure common.cu:1189",
        ".. gpu-1-7 pid 2448661: Test failure common.cu:1189",
    ]
    assert run_problems(run) == [
        "wrong values in 1 of 25 result rows, first at 1 MiB float sum (96 out-of-place, 32 in-place)",
        "Out of bounds values : 4 FAILED",
        ".. gpu-1-1 pid 662195: Test failure common.cu:1189 (and 1 more failure line)",
    ]
    assert check_bus_bandwidth(run, 1) == (
        "all_reduce_perf: wrong values in 1 of 25 result rows, first at 1 MiB float sum (96 out-of-place, 32 in-place)"
    )


def test_a_wrong_count_printed_in_exponent_form_is_a_count() -> None:
    # %g prints counts from 1e6 up as 1.04858e+06; the capture's 96 is rewritten that way here.
    text = fixture(GH200_WRONG).replace("2.20      96", "2.20  1.04858e+06", 1)
    assert parse_nccl_tests(text)["rows"][17]["out_of_place"]["wrong"] == 1048580


def test_per_iteration_columns_and_a_timestamp_are_read_past() -> None:
    # No published run shows them: the row is the capture's 1 MiB row laid out as util.cu prints with
    # per-iteration timing (four statistics after each body) and with timestamps (date and time last).
    row = fixture(GH200_WRONG).split("\n")[28]
    assert row.startswith("     1048576")
    head, out_body, in_body = row[:52], row[52:85], row[85:]
    stats = "   470.11   480.53   480.53     0.62"
    expected = parse_nccl_tests(row)["rows"]
    assert parse_nccl_tests(head + out_body + stats + in_body + stats)["rows"] == expected
    assert parse_nccl_tests(row + "  2026-01-23 10:15:02")["rows"] == expected


def test_devices_busy_before_any_row_names_the_cuda_failure() -> None:
    run = parse_nccl_tests(fixture(GH200_BUSY))
    assert len(run["ranks"]) == 8
    assert run["rows"] == []
    assert (run["out_of_bounds"], run["avg_busbw_gbs"]) == (None, None)
    assert len(run["failures"]) == 12
    assert run["nccl_version"] == "2.26.6"
    assert run_problems(run) == [
        "gpu-1-1: Test CUDA failure common.cu:1304 'CUDA-capable device(s) is/are busy or unavailable'"
        " (and 11 more failure lines)",
        "printed no result rows",
    ]
    assert check_bus_bandwidth(run, 100) == (
        "all_reduce_perf: gpu-1-1: Test CUDA failure common.cu:1304"
        " 'CUDA-capable device(s) is/are busy or unavailable' (and 11 more failure lines)"
    )


def test_nccl_failure_among_nccl_info_and_warn_lines() -> None:
    run = parse_nccl_tests(fixture(RTX5090_FAIL))
    assert run["nccl_version"] == "2.25.1+cuda12.8"
    assert [(r["rank"], r["pci_bus"]) for r in run["ranks"]] == [(0, "0x21"), (1, "0x61")]
    assert run["config"] is not None
    assert run["config"]["gpus_per_thread"] == 2
    assert run["rows"] == []
    # NCCL WARN lines are not failures: a healthy run prints them too.
    assert run["failures"][0] == (
        "GENOA-06: Test NCCL failure common.cu:392 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / '"
    )
    assert run["failures"][1:] == [
        f".. GENOA-06 pid 4766: Test failure {where}"
        for where in ("common.cu:590", "all_reduce.cu:90", "common.cu:623", "common.cu:1078", "common.cu:891")
    ]
    assert check_bus_bandwidth(run, 10) == (
        "nccl-tests: GENOA-06: Test NCCL failure common.cu:392"
        " 'unhandled cuda error (run with NCCL_DEBUG=INFO for details) / ' (and 5 more failure lines)"
    )


def test_single_node_four_gpus_in_one_process() -> None:
    run = parse_nccl_tests(fixture(RTX5090_FOUR))
    assert {r["pid"] for r in run["ranks"]} == {2168673}
    assert [r["device"] for r in run["ranks"]] == [0, 1, 2, 3]
    assert largest(run) == (27.26, 27.28)
    assert run["avg_busbw_gbs"] == 9.09703
    assert check_bus_bandwidth(run, 25) is None
    assert check_bus_bandwidth(run, 30) == (
        "nccl-tests: bus bandwidth 27.26 GB/s at 128 MiB (out-of-place), needs >= 30 GB/s"
    )


def test_one_rank_moves_nothing_over_a_bus_and_the_message_says_so() -> None:
    run = parse_nccl_tests(fixture(RTX5090_ONE))
    assert run["ranks"][0]["pci_bus"] == "0x21"
    assert run["rows"][-1]["in_place"] == {"time_us": 0.08, "algbw_gbs": 1777718.25, "busbw_gbs": 0.0, "wrong": 0}
    assert run["avg_busbw_gbs"] == 0
    assert check_bus_bandwidth(run, 100) == (
        "nccl-tests: bus bandwidth 0 GB/s at 128 MiB (out-of-place), needs >= 100 GB/s;"
        " a single rank moves no data between GPUs"
    )


def test_eight_gpus_newest_version_published_without_its_summary() -> None:
    run = parse_nccl_tests(fixture(RTX5090_EIGHT))
    assert (run["test"], run["nccl_tests_version"]) == ("all_reduce_perf", "2.18.2")
    assert run["nccl_version"] == "2.29.7"
    assert run["config"] is not None
    assert run["config"]["gpus_per_thread"] == 8
    assert len(run["ranks"]) == 8
    assert largest(run) == (43.86, 44.07)
    assert (run["out_of_bounds"], run["avg_busbw_gbs"]) == (None, None)
    assert check_bus_bandwidth(run, 40) == (
        "all_reduce_perf: stopped after the 128 MiB row without printing its summary"
        " ('# Out of bounds values', '# Avg bus bandwidth')"
    )


def test_srun_labelled_rows_from_two_p5_nodes() -> None:
    run = parse_nccl_tests(fixture(H100_SRUN))
    assert run["config"] is None
    assert run["ranks"] == []
    assert [r["size_bytes"] for r in run["rows"]] == [8 << i for i in range(32)]
    assert largest(run) == (487.09, 487.26)
    assert run_problems(run) == [
        "stopped after the 16 GiB row without printing its summary ('# Out of bounds values', '# Avg bus bandwidth')"
    ]


def test_alltoall_without_in_place_validation_reads_not_available() -> None:
    run = parse_nccl_tests(fixture(ALLTOALL))
    assert run["config"] is not None
    assert (run["config"]["step"], run["config"]["step_kind"]) == (1048576, "bytes")
    (row,) = run["rows"]
    assert (row["type"], row["redop"], row["root"]) == ("float", "none", -1)
    assert row["in_place"] == {"time_us": 0.78, "algbw_gbs": 43046.1, "busbw_gbs": 0.0, "wrong": None}
    assert row["out_of_place"] == {"time_us": 19.56, "algbw_gbs": 1715.44, "busbw_gbs": 0.0, "wrong": 0}
    assert run_problems(run) == []


@pytest.mark.parametrize("name", ALL)
def test_every_capture_parses_to_json(name: str) -> None:
    run = parse_nccl_tests(fixture(name))
    assert json.loads(json.dumps(run, allow_nan=False)) == run
    for problem in run_problems(run):
        assert "\n" not in problem


@pytest.mark.parametrize("name", ALL)
def test_launcher_prefixes_crlf_and_indentation_do_not_change_the_result(name: str) -> None:
    text = fixture(name)
    expected = parse_nccl_tests(text)
    lines = text.split("\n")
    assert parse_nccl_tests(text.replace("\n", "\r\n")) == expected
    assert parse_nccl_tests("\n".join("[1,0]<stdout>:" + line for line in lines)) == expected
    assert parse_nccl_tests("\n".join("  " + line for line in lines)) == expected
    if not text.startswith("0: "):
        assert parse_nccl_tests("\n".join("12: " + line for line in lines)) == expected


def test_a_row_cut_short_is_an_error_naming_its_line() -> None:
    text = fixture(GH200_WRONG).replace("1572.73   21.34   21.34       0\n", "\n", 1)
    with pytest.raises(
        ParseError, match=r"^line 34: '33554432 .*' is not a result row: 4 values after the root column"
    ):
        parse_nccl_tests(text)


def test_two_runs_in_one_output_are_refused() -> None:
    with pytest.raises(ParseError, match=r"^line 40: a second '# nThread' header") as error:
        parse_nccl_tests(fixture(RTX5090_FOUR) + fixture(RTX5090_ONE))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "name",
    [
        "ibstat_h100_mixed_ib_eth_3_down_gpud.txt",
        "topo_h200x8_12nic_tabs_distributedai.txt",
        "query_error_no_devices_genv.txt",
    ],
)
def test_other_outputs_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ParseError, match=r"^no nccl-tests output: ") as error:
        parse_nccl_tests(fixture(name))
    assert "\n" not in str(error.value)


def test_sizes_read_as_binary_units() -> None:
    assert [format_bytes(n) for n in (8, 1024, 1048576, 134217728, 8 * GiB, 1000000000)] == [
        "8 B",
        "1 KiB",
        "1 MiB",
        "128 MiB",
        "8 GiB",
        "953.674 MiB",
    ]


# Lines that launchers and NCCL print into a run's output, taken from the captures above.
_NOISE = sorted(
    {
        line
        for name in (H100_OMPI, RTX5090_FAIL)
        for line in fixture(name).split("\n")
        if "NCCL INFO" in line or "NCCL WARN" in line or line.startswith(("[bm-h100", "WARNING:", "  Local host"))
    }
)


@st.composite
def mutated_captures(draw: st.DrawFn) -> str:
    """A real capture with lines deleted, launcher and NCCL lines inserted, spaces and tabs swapped, CRLF."""
    lines = fixture(draw(st.sampled_from(ALL))).split("\n")
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        del lines[draw(st.integers(min_value=0, max_value=len(lines) - 1))]
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        lines.insert(draw(st.integers(min_value=0, max_value=len(lines))), draw(st.sampled_from(_NOISE)))
    if draw(st.booleans()):
        lines = ["[1,0]<stdout>:" + line for line in lines]
    chars = list("\n".join(lines))
    for at in draw(st.lists(st.integers(min_value=0, max_value=max(len(chars) - 1, 0)), max_size=10)):
        if chars and chars[at] in " \t":
            chars[at] = "\t" if chars[at] == " " else " "
    text = "".join(chars)
    return text.replace("\n", "\r\n") if draw(st.booleans()) else text


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=mutated_captures(),
    threshold=st.floats(min_value=0, max_value=1000),
    min_bytes=st.none() | st.integers(0, 1 << 35),
)
def test_mutated_captures_parse_or_raise_parse_error_only(text: str, threshold: float, min_bytes: int | None) -> None:
    try:
        run = parse_nccl_tests(text)
    except ParseError as error:
        message = str(error)
    else:
        json.dumps(run, allow_nan=False)
        message = check_bus_bandwidth(run, threshold, min_bytes) or ""
        assert all("\n" not in problem for problem in run_problems(run))
    assert "\n" not in message
