"""``ibv_devinfo`` (short and ``-v``) from real hosts: InfiniBand and RoCE HCAs, one and two ports."""

from __future__ import annotations

import pytest

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibv_devinfo import parse_ibv_devinfo
from tests.parsers import FIXTURES, fixture

# The captures of a tool that failed, each with the line the parser says.
REFUSED = {"ibv_devinfo_siw_failed_open_only_ntbcxl90.txt": "no 'hca_id:' line (first line: 'Failed to open device')"}
ALL = sorted(p.name for p in FIXTURES.glob("ibv_devinfo_*.txt") if p.name not in REFUSED)


def test_connectx6_infiniband_port_active() -> None:
    assert parse_ibv_devinfo(fixture("ibv_devinfo_cx6_1hca_ib_tabs_ucx9914.txt")) == [
        {
            "hca_id": "mlx5_0",
            "transport": "InfiniBand",
            "fw_ver": "20.32.1010",
            "node_guid": "0800:3803:00b8:b188",
            "sys_image_guid": "0800:3803:00b8:b188",
            "vendor_id": "0x119f",
            "vendor_part_id": 4123,
            "hw_ver": "0x0",
            "board_id": "BL_12001644",
            "phys_port_cnt": 1,
            "ports": [
                {
                    "port": 1,
                    "state": "PORT_ACTIVE",
                    "max_mtu": 4096,
                    "active_mtu": 4096,
                    "sm_lid": 24,
                    "port_lid": 386,
                    "port_lmc": "0x00",
                    "link_layer": "InfiniBand",
                    "active_width": None,
                    "active_speed": None,
                    "physical_state": None,
                    "gids": [],
                }
            ],
        }
    ]


def test_h200_node_eleven_roce_hcas_in_output_order() -> None:
    hcas = parse_ibv_devinfo(fixture("ibv_devinfo_h200_11hca_roce_spaces_deepep355.txt"))
    assert [h["hca_id"] for h in hcas] == [
        "mlx5_0",
        "mlx5_1",
        "mlx5_2",
        "mlx5_10",
        "mlx5_11",
        "mlx5_3",
        "mlx5_4",
        "mlx5_5",
        "mlx5_6",
        "mlx5_7",
        "mlx5_bond_0",
    ]
    assert {p["link_layer"] for h in hcas for p in h["ports"]} == {"Ethernet"}
    assert {p["state"] for h in hcas for p in h["ports"]} == {"PORT_ACTIVE"}
    bond = hcas[-1]
    assert (bond["fw_ver"], bond["vendor_part_id"], bond["board_id"]) == ("26.43.2026", 4127, "MT_0000000531")
    assert bond["ports"][0]["active_mtu"] == 1024
    assert hcas[4]["node_guid"] == "58a2:e103:00b3:2275"
    assert hcas[4]["sys_image_guid"] == "58a2:e103:00b3:2274"


def test_two_port_hcas_with_one_port_down() -> None:
    hcas = parse_ibv_devinfo(fixture("ibv_devinfo_cx3_2hca_2port_tabs_heioy.txt"))
    assert [h["hca_id"] for h in hcas] == ["mlx4_1", "mlx4_0"]
    for hca in hcas:
        assert hca["phys_port_cnt"] == 2
        assert [(p["port"], p["state"]) for p in hca["ports"]] == [(1, "PORT_ACTIVE"), (2, "PORT_DOWN")]
    assert (hcas[1]["ports"][0]["sm_lid"], hcas[1]["ports"][0]["port_lid"]) == (18, 32)


def test_verbose_form_adds_width_speed_physical_state_and_gids() -> None:
    (hca,) = parse_ibv_devinfo(fixture("ibv_devinfo_v_cx5_roce_spaces_martins3.txt"))
    assert (hca["hca_id"], hca["fw_ver"], hca["vendor_part_id"]) == ("rocep0s6", "16.31.1014", 4119)
    (port,) = hca["ports"]
    assert port["state"] == "PORT_ACTIVE"
    assert port["physical_state"] == "LINK_UP"
    assert port["link_layer"] == "Ethernet"
    assert (port["active_width"], port["active_speed"]) == ("1X", "10.0 Gbps")
    assert port["active_mtu"] == 1024
    assert port["gids"][1] == "fe80::8e2a:8eff:fe40:a37c, RoCE v2"
    assert len(port["gids"]) == 6


@pytest.mark.parametrize("name", ALL)
def test_crlf_and_tab_expansion_do_not_change_the_result(name: str) -> None:
    text = fixture(name)
    expected = parse_ibv_devinfo(text)
    assert parse_ibv_devinfo(text.replace("\n", "\r\n")) == expected
    assert parse_ibv_devinfo(text.expandtabs(8)) == expected


def test_a_port_number_that_is_not_a_number_is_refused() -> None:
    text = fixture("ibv_devinfo_cx6_1hca_ib_tabs_ucx9914.txt").replace("port:\t1", "port:\tone")
    with pytest.raises(ParseError, match="hca mlx5_0: port 'one' is not a number"):
        parse_ibv_devinfo(text)


@pytest.mark.parametrize("name", ["ibstat_h100_mixed_ib_eth_3_down_gpud.txt", "query_error_no_devices_genv.txt"])
def test_other_outputs_are_refused(name: str) -> None:
    with pytest.raises(ParseError, match="no 'hca_id:' line"):
        parse_ibv_devinfo(fixture(name))


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_tool_that_failed_is_refused_quoting_what_it_said(name: str) -> None:
    with pytest.raises(ParseError) as error:
        parse_ibv_devinfo(fixture(name))
    assert str(error.value) == REFUSED[name]


def test_no_ib_devices_found_is_a_host_without_hcas() -> None:
    # the library's warnings first, then ibv_devinfo's own line
    assert parse_ibv_devinfo(fixture("ibv_devinfo_none_no_devices_driver_warnings_pib2.txt")) == []


def test_an_output_cut_at_its_start_is_refused_not_read_short() -> None:
    # A paste that lost its first character ("ca_id: mlx5_0"): the first HCA's attributes have no hca_id.
    text = fixture("ibv_devinfo_vv_cx6_2hca_ib_hdr_4x50_1_disabled_tabs_ucx9908.txt")
    start = text.index("hca_id:")
    with pytest.raises(ParseError, match="before any 'hca_id:' line \\(the output's start is missing\\)"):
        parse_ibv_devinfo(text[start + 1 :])


def test_infiniband_hdr_port_at_4x_50_gbps_and_a_disabled_one() -> None:
    first, second = parse_ibv_devinfo(fixture("ibv_devinfo_vv_cx6_2hca_ib_hdr_4x50_1_disabled_tabs_ucx9908.txt"))
    assert [(p["state"], p["physical_state"], p["active_width"], p["active_speed"]) for p in first["ports"]] == [
        ("PORT_ACTIVE", "LINK_UP", "4X", "50.0 Gbps")
    ]
    assert [(p["state"], p["physical_state"]) for p in second["ports"]] == [("PORT_DOWN", "DISABLED")]


def test_twelve_roce_hcas_with_two_ports_down() -> None:
    hcas = parse_ibv_devinfo(fixture("ibv_devinfo_cx7_12hca_roce_2_down_tabs_slurmv4.txt"))
    down = [h["hca_id"] for h in hcas if h["ports"][0]["state"] == "PORT_DOWN"]
    assert (len(hcas), down) == (12, ["mlx5_9", "mlx5_11"])
    assert {h["ports"][0]["link_layer"] for h in hcas} == {"Ethernet"}


def test_failure_lines_around_a_device_leave_the_device_read() -> None:
    hcas = parse_ibv_devinfo(fixture("ibv_devinfo_cx3vf_1hca_failed_open_interleaved_spaces_hustcat8.txt"))
    assert [(h["hca_id"], h["ports"][0]["state"]) for h in hcas] == [("mlx4_2", "PORT_ACTIVE")]
