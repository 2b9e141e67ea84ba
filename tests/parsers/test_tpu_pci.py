"""TPU detection from a real TPU v6e host: ``ls -l /dev/vfio`` and the IOMMU groups' PCI ids."""

from __future__ import annotations

import pytest

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.tpu_pci import GOOGLE_VENDOR_ID, TPU_GENERATIONS, parse_tpu_pci
from tests.parsers import fixture

V6E = "tpu_v6e_vfio_sysfs_ray65105.txt"


def test_v6e_host_four_chips_with_their_vfio_nodes() -> None:
    result = parse_tpu_pci(fixture(V6E))
    assert result["generation"] == "v6e"
    assert result["chip_count"] == 4
    assert result["devices"][0] == {
        "pci_address": "0000:00:04.0",
        "vendor_id": "0x1ae0",
        "device_id": "0x006f",
        "generation": "v6e",
        "iommu_group": 0,
    }
    assert [d["pci_address"] for d in result["devices"]] == [
        "0000:00:04.0",
        "0000:00:05.0",
        "0000:00:06.0",
        "0000:00:07.0",
    ]
    assert [d["iommu_group"] for d in result["devices"]] == [0, 1, 2, 3]
    # The container node /dev/vfio/vfio is not a chip.
    assert result["nodes"] == [
        {"path": "/dev/vfio/0", "major": 245, "minor": 2},
        {"path": "/dev/vfio/1", "major": 245, "minor": 1},
        {"path": "/dev/vfio/2", "major": 245, "minor": 3},
        {"path": "/dev/vfio/3", "major": 245, "minor": 0},
    ]


def test_the_nodes_alone_count_the_chips_without_naming_a_generation() -> None:
    listing = fixture(V6E).split("--- sysfs devices ---")[0]
    result = parse_tpu_pci(listing)
    assert (result["devices"], result["generation"], result["chip_count"]) == ([], None, 4)


def test_the_pci_ids_alone_name_the_generation() -> None:
    sysfs = "--- sysfs devices ---" + fixture(V6E).split("--- sysfs devices ---")[1]
    result = parse_tpu_pci(sysfs)
    assert (result["nodes"], result["generation"], result["chip_count"]) == ([], "v6e", 4)


def test_crlf_does_not_change_the_result() -> None:
    text = fixture(V6E)
    assert parse_tpu_pci(text.replace("\n", "\r\n")) == parse_tpu_pci(text)


def test_the_generation_table_is_keyed_by_normalised_google_device_ids() -> None:
    assert GOOGLE_VENDOR_ID == "0x1ae0"
    assert TPU_GENERATIONS == {"0x005e": "v4", "0x0063": "v5e", "0x0062": "v5p", "0x006f": "v6e", "0x0076": "7x"}


@pytest.mark.parametrize(
    "name", ["ibstat_h100_mixed_ib_eth_3_down_gpud.txt", "query_h200x8_header_units_distributedai.csv"]
)
def test_output_without_devices_or_nodes_is_refused(name: str) -> None:
    with pytest.raises(ParseError, match="no PCI device and no /dev/vfio or /dev/accel node listed"):
        parse_tpu_pci(fixture(name))
