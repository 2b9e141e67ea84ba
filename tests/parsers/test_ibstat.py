"""``ibstat`` from real hosts: mixed InfiniBand/Ethernet with ports down, and a run that failed midway."""

from __future__ import annotations

import pytest

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibstat import parse_ibstat
from tests.parsers import fixture

MIXED = "ibstat_h100_mixed_ib_eth_3_down_gpud.txt"
FAILED = "ibstat_a100_8ca_ibpanic_exit255_gpud.txt"


def test_mixed_infiniband_and_ethernet_with_three_ports_down() -> None:
    result = parse_ibstat(fixture(MIXED))
    assert result["errors"] == []
    cas = {ca["name"]: ca for ca in result["cas"]}
    assert len(cas) == 12
    assert cas["mlx5_0"] == {
        "name": "mlx5_0",
        "ca_type": "MT4129",
        "number_of_ports": 1,
        "firmware_version": "28.39.1002",
        "hardware_version": "0",
        "node_guid": "0x946dae0300cde72c",
        "system_image_guid": "0x946dae0300cde72c",
        "ports": [
            {
                "port": 1,
                "state": "Active",
                "physical_state": "LinkUp",
                "rate": 400,
                "base_lid": 75,
                "lmc": 0,
                "sm_lid": 334,
                "capability_mask": "0xa751e848",
                "port_guid": "0x946dae0300cde72c",
                "link_layer": "InfiniBand",
            }
        ],
    }
    down = sorted(n for n, ca in cas.items() if ca["ports"][0]["state"] == "Down")
    assert down == ["mlx5_2", "mlx5_7", "mlx5_8"]
    assert {cas[n]["ports"][0]["physical_state"] for n in down} == {"Disabled"}
    infiniband = [n for n, ca in cas.items() if ca["ports"][0]["link_layer"] == "InfiniBand"]
    assert len(infiniband) == 8
    assert {cas[n]["ports"][0]["rate"] for n in infiniband} == {400}
    assert (cas["mlx5_1"]["ca_type"], cas["mlx5_1"]["ports"][0]["rate"]) == ("MT4125", 100)


def test_a_run_ending_in_ibpanic_keeps_every_ca_read_and_records_the_error() -> None:
    result = parse_ibstat(fixture(FAILED))
    assert [ca["name"] for ca in result["cas"]] == [f"mlx5_{i}" for i in range(8)]
    assert result["errors"] == ["ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory"]
    port = result["cas"][7]["ports"][0]
    assert (port["state"], port["rate"], port["base_lid"], port["sm_lid"]) == ("Active", 200, 13305, 1)
    assert result["cas"][0]["firmware_version"] == "20.41.1000"


@pytest.mark.parametrize("name", [MIXED, FAILED])
def test_crlf_and_tab_expansion_do_not_change_the_result(name: str) -> None:
    text = fixture(name)
    expected = parse_ibstat(text)
    assert parse_ibstat(text.replace("\n", "\r\n")) == expected
    assert parse_ibstat(text.expandtabs(8)) == expected


def test_only_the_error_line_is_an_error_quoting_it() -> None:
    panic = fixture(FAILED).rstrip("\n").splitlines()[-1]
    with pytest.raises(ParseError, match=r"no CA block: ibpanic: \[1400444\] main: stat of IB device 'mlx5_8'"):
        parse_ibstat(panic)


def test_a_rate_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ParseError, match="CA mlx5_0: Rate: 'fast' is not a number"):
        parse_ibstat(fixture(MIXED).replace("Rate: 400", "Rate: fast", 1))


@pytest.mark.parametrize("name", ["ibv_devinfo_cx6_1hca_ib_tabs_ucx9914.txt", "topo_gb200x4_8nic_spaces_rhel4nv.txt"])
def test_other_outputs_are_refused(name: str) -> None:
    with pytest.raises(ParseError, match="no CA block"):
        parse_ibstat(fixture(name))
