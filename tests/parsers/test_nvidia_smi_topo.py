"""``nvidia-smi topo -m`` from real machines: H200, GB200, B300, PCIe-only and consumer boxes."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_deploy.host.profile_types import Topology
from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.nvidia_smi_topo import parse_topo
from tests.parsers import FIXTURES, fixture

H200 = "topo_h200x8_12nic_tabs_distributedai.txt"
GB200 = "topo_gb200x4_8nic_spaces_rhel4nv.txt"
B300 = "topo_b300x8_9nic_tabs_literal_ansi_sglang26039.txt"
PCIE = "topo_rtx6000x8_pcie_0nic_tabs_andyub.txt"
P4 = "topo_p4x1_numa_na_tabs_hami99.txt"
RTX5090 = "topo_rtx5090x2_tabs_club3090_1229.txt"
RTX4090 = "topo_rtx4090x8_2nic_tabs_nolegend_gpuallocator17.txt"
ALL = sorted(p.name for p in FIXTURES.glob("topo_*.txt"))


def names(topo: Topology, kind: Literal["gpus", "nics"]) -> list[str]:
    return [device["name"] for device in topo[kind]]


def test_h200_eight_gpus_twelve_nics_affinity_links_and_nic_names() -> None:
    topo = parse_topo(fixture(H200))
    assert names(topo, "gpus") == [f"GPU{i}" for i in range(8)]
    assert names(topo, "nics") == [f"NIC{i}" for i in range(12)]
    assert topo["gpus"][0] == {
        "name": "GPU0",
        "index": 0,
        "cpu_affinity": "0-55,112-167",
        "numa_affinity": "0",
        "gpu_numa_id": None,
    }
    assert topo["gpus"][7]["cpu_affinity"] == "56-111,168-223"
    assert topo["gpus"][7]["numa_affinity"] == "1"
    matrix = topo["matrix"]
    assert matrix["GPU0"]["GPU1"] == "NV18"
    assert matrix["GPU0"]["NIC0"] == "PXB"
    assert matrix["GPU1"]["NIC3"] == "PXB"
    assert matrix["GPU0"]["NIC6"] == "SYS"
    assert matrix["NIC1"]["NIC2"] == "PIX"
    assert matrix["NIC11"]["GPU7"] == "PXB"
    assert matrix["GPU3"]["GPU3"] == "X"
    assert topo["nic_legend"]["NIC10"] == "mlx5_10"
    assert topo["nics"][11] == {"name": "NIC11", "device": "mlx5_11"}
    assert topo["legend"]["NV#"] == "Connection traversing a bonded set of # NVLinks"
    assert topo["legend"]["X"] == "Self"


def test_gb200_tray_space_separated_every_gpu_nic_path_crosses_the_system() -> None:
    topo = parse_topo(fixture(GB200))
    assert names(topo, "gpus") == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert len(topo["nics"]) == 8
    assert topo["gpus"][2] == {
        "name": "GPU2",
        "index": 2,
        "cpu_affinity": "72-143",
        "numa_affinity": "1,18-33",
        "gpu_numa_id": None,
    }
    matrix = topo["matrix"]
    assert {matrix[g][n] for g in names(topo, "gpus") for n in names(topo, "nics")} == {"SYS"}
    assert {matrix[a][b] for a in names(topo, "gpus") for b in names(topo, "gpus") if a != b} == {"NV18"}
    assert matrix["NIC2"]["NIC3"] == matrix["NIC6"]["NIC7"] == "PIX"
    assert topo["nics"][7]["device"] == "mlx5_7"


def test_b300_header_with_escape_codes_that_lost_their_esc_byte() -> None:
    text = fixture(B300)
    assert "\t[4mGPU0" in text
    assert "\x1b" not in text
    topo = parse_topo(text)
    assert len(topo["gpus"]) == 8
    assert len(topo["nics"]) == 9
    assert topo["gpus"][7]["cpu_affinity"] == "64-127,192-255"
    assert topo["matrix"]["GPU4"]["NIC4"] == "PXB"
    assert topo["matrix"]["NIC8"]["GPU0"] == "SYS"
    # NIC numbers are not device numbers: the legend is the only way to the HCA.
    assert topo["nics"][0] == {"name": "NIC0", "device": "mlx5_10"}
    assert topo["nics"][8] == {"name": "NIC8", "device": "mlx5_bond_0"}


def test_redirected_output_keeps_the_esc_bytes_and_parses_the_same() -> None:
    text = fixture(PCIE)
    assert text.startswith("\t\x1b[4mGPU0\t")
    assert "GPU NUMA ID\x1b[0m\n" in text
    topo = parse_topo(text)
    assert names(topo, "gpus") == [f"GPU{i}" for i in range(8)]
    assert topo["nics"] == []
    assert topo["nic_legend"] == {}
    assert topo["matrix"]["GPU0"]["GPU1"] == "PIX"
    assert topo["matrix"]["GPU0"]["GPU2"] == "PXB"
    assert not any(link.startswith("NV") for row in topo["matrix"].values() for link in row.values())
    assert topo["gpus"][5]["cpu_affinity"] == "0-19"


def test_single_gpu_with_numa_affinity_not_available() -> None:
    topo = parse_topo(fixture(P4))
    assert topo["gpus"] == [
        {"name": "GPU0", "index": 0, "cpu_affinity": "0-7", "numa_affinity": None, "gpu_numa_id": None}
    ]
    assert topo["matrix"] == {"GPU0": {"GPU0": "X"}}


def test_two_pcie_gpus_behind_one_host_bridge() -> None:
    topo = parse_topo(fixture(RTX5090))
    assert topo["matrix"] == {"GPU0": {"GPU0": "X", "GPU1": "PHB"}, "GPU1": {"GPU0": "PHB", "GPU1": "X"}}
    assert topo["gpus"][1]["cpu_affinity"] == "0-63"


def test_nics_without_a_nic_legend_have_no_device() -> None:
    topo = parse_topo(fixture(RTX4090))
    assert topo["nics"] == [{"name": "NIC0", "device": None}, {"name": "NIC1", "device": None}]
    assert topo["legend"] == {}
    assert topo["nic_legend"] == {}
    assert topo["matrix"]["GPU6"]["NIC0"] == "PHB"
    assert topo["matrix"]["NIC0"]["NIC1"] == "PIX"
    assert topo["gpus"][4]["numa_affinity"] == "1"


@pytest.mark.parametrize("name", ALL)
def test_every_capture_gives_a_full_symmetric_matrix_as_json(name: str) -> None:
    topo = parse_topo(fixture(name))
    devices = names(topo, "gpus") + names(topo, "nics")
    assert list(topo["matrix"]) == devices
    for a in devices:
        assert list(topo["matrix"][a]) == devices
        assert topo["matrix"][a][a] == "X"
        for b in devices:
            assert topo["matrix"][a][b] == topo["matrix"][b][a]
    assert json.loads(json.dumps(topo)) == topo


@pytest.mark.parametrize("name", ALL)
def test_crlf_tabs_as_spaces_and_escape_bytes_do_not_change_the_result(name: str) -> None:
    text = fixture(name)
    expected = parse_topo(text)
    assert parse_topo(text.replace("\n", "\r\n")) == expected
    assert parse_topo(text.expandtabs(8)) == expected
    assert parse_topo(text.replace("\x1b", "")) == expected
    underlined = text.replace("GPU0", "\x1b[4mGPU0", 1)
    assert parse_topo(underlined) == expected


def test_a_missing_row_is_an_error_naming_it() -> None:
    lines = fixture(H200).splitlines(keepends=True)
    del lines[4]
    with pytest.raises(ParseError, match="no matrix row for GPU3"):
        parse_topo("".join(lines))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("ibstat_h100_mixed_ib_eth_3_down_gpud.txt", "no header line"),
        ("query_error_no_devices_genv.txt", "no header line"),
        ("query_h200x8_header_units_distributedai.csv", "no header line"),
    ],
)
def test_other_outputs_are_refused_in_one_line(name: str, message: str) -> None:
    with pytest.raises(ParseError, match=message) as error:
        parse_topo(fixture(name))
    assert "\n" not in str(error.value)


_CODES = ["\x1b[4m", "\x1b[0m", "\x1b[1m", "[4m", "[0m", "[1m"]


@st.composite
def mutated_captures(draw: st.DrawFn) -> str:
    """A real capture with lines deleted, tabs and spaces swapped, CRLF line ends and SGR codes inserted."""
    lines = fixture(draw(st.sampled_from(ALL))).split("\n")
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        del lines[draw(st.integers(min_value=0, max_value=len(lines) - 1))]
    chars = list("\n".join(lines))
    for at in draw(st.lists(st.integers(min_value=0, max_value=max(len(chars) - 1, 0)), max_size=10)):
        if chars and chars[at] in " \t":
            chars[at] = "\t" if chars[at] == " " else " "
    text = "".join(chars)
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    inserts = draw(
        st.lists(st.tuples(st.integers(min_value=0, max_value=len(text)), st.sampled_from(_CODES)), max_size=4)
    )
    for at, code in sorted(inserts, reverse=True):
        text = text[:at] + code + text[at:]
    return text


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=mutated_captures())
def test_mutated_captures_parse_or_raise_parse_error_only(text: str) -> None:
    try:
        topo = parse_topo(text)
    except ParseError as error:
        message = str(error)
    else:
        message = ""
        devices = names(topo, "gpus") + names(topo, "nics")
        assert list(topo["matrix"]) == devices
        assert all(list(row) == devices for row in topo["matrix"].values())
        json.dumps(topo)
    assert "\n" not in message
