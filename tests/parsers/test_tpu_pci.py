"""TPU detection from a real TPU v6e host: ``ls -l /dev/vfio`` and the IOMMU groups' PCI ids."""

from __future__ import annotations

import re

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
    assert {TPU_GENERATIONS[i] for i in ("0x005e", "0x0063", "0x0062", "0x006f", "0x0076")} == {
        "v4",
        "v5e",
        "v5p",
        "v6e",
        "7x",
    }
    assert all(re.fullmatch(r"0x[0-9a-f]{4}", device_id) for device_id in TPU_GENERATIONS)


@pytest.mark.parametrize(
    "name",
    [
        "ibstat_h100_mixed_ib_eth_3_down_gpud.txt",
        "query_h200x8_header_units_distributedai.csv",
        # libtpu's own errors: a chip in use names no device in a form read here
        "tpu_unknown_4chip_vfio_busy_error_gvisor11545.txt",
        "tpu_unknown_accel_inuse_error_tpustarter.txt",
        "tpu_unknown_inuse_error_sglangjax857.txt",
    ],
)
def test_output_without_devices_or_nodes_is_refused(name: str) -> None:
    with pytest.raises(ParseError, match="no PCI device, no /dev/vfio or /dev/accel node and no tpu-info chip listed"):
        parse_tpu_pci(fixture(name))


def test_plain_lspci_names_google_and_prints_the_device_id_pci_ids_lacks() -> None:
    # A TPU v2-8 VM: "00:04.0 Unassigned class [ff00]: Google, Inc. Device 0027", four chips.
    result = parse_tpu_pci(fixture("tpu_v2_4chip_lspci_tinygrad.txt"))
    assert (result["chip_count"], result["generation"]) == (4, "v2/v3")
    assert result["devices"][0] == {
        "pci_address": "0000:00:04.0",
        "vendor_id": "0x1ae0",
        "device_id": "0x0027",
        "generation": "v2/v3",
        "iommu_group": None,
    }


def test_plain_lspci_of_other_vendors_is_a_host_without_tpus() -> None:
    text = "00:00.0 Host bridge: Intel Corporation 440FX - 82441FX PMC [Natoma] (rev 02)\n"
    assert parse_tpu_pci(text)["chip_count"] == 0


def test_a_google_device_lspci_named_without_its_id_asks_for_lspci_nn() -> None:
    line = fixture("tpu_v2_4chip_lspci_tinygrad.txt").splitlines()[0].replace("Device 0027", "Cloud TPU")
    with pytest.raises(ParseError, match=r"lspci names a Google device without its id .*: list it with lspci -nn"):
        parse_tpu_pci(line)


def test_lspci_nn_gives_the_ids_and_the_generation() -> None:
    line = fixture("tpu_v2_4chip_lspci_tinygrad.txt").splitlines()[0].replace("Device 0027", "Device [1ae0:006f]")
    assert parse_tpu_pci(line)["generation"] == "v6e"


def test_addresses_without_ids_or_names_say_which_listing_is_needed() -> None:
    # libtpu's device scan log names the PCI addresses but not as lspci or sysfs' files do.
    with pytest.raises(ParseError) as error:
        parse_tpu_pci(fixture("tpu_v2_4chip_libtpu_devscan_log_tinygrad.txt"))
    assert str(error.value) == (
        "PCI devices 0000:00:04.0, 0000:00:05.0, 0000:00:06.0, 0000:00:07.0 listed without their vendor and"
        " device ids: list them with lspci -nn, or sysfs' vendor and device files"
    )


def test_ls_of_the_accel_nodes_without_l_counts_them() -> None:
    result = parse_tpu_pci(fixture("tpu_v3_4chip_ls_accel_plain_tpustarter.txt"))
    assert result["chip_count"] == 4
    assert result["nodes"][3] == {"path": "/dev/accel3", "major": None, "minor": None}


def test_a_dev_listing_with_only_the_vfio_container_is_a_host_without_chips() -> None:
    # find /dev | grep vfio on a TPU VM image too old to expose its chips
    result = parse_tpu_pci(fixture("tpu_unknown_0chip_find_dev_vfio_gvisor10795.txt"))
    assert (result["chip_count"], result["nodes"], result["generation"]) == (0, [], None)


@pytest.mark.parametrize(
    ("name", "generation", "count", "first"),
    [
        ("tpu_v4_4chip_tpuinfo_rich_cores_readme.txt", "v4", 4, "/dev/accel0"),
        ("tpu_v4_4chip_tpuinfo_rich_devices_readme.txt", "v4", 4, "/dev/accel0"),
        ("tpu_v5e_1chip_tpuinfo_markdown_jaxlog_dragce.txt", "v5e", 1, "/dev/vfio/0"),
        ("tpu_v6e_4chip_tpuinfo_rich_rightheader_mlautosolutions.txt", "v6e", 4, "/dev/vfio/0"),
    ],
)
def test_tpu_info_chip_tables_in_box_and_markdown_form(name: str, generation: str, count: int, first: str) -> None:
    result = parse_tpu_pci(fixture(name))
    assert (result["generation"], result["chip_count"]) == (generation, count)
    assert result["chips"][0] == {"path": first, "generation": generation}
    # the utilization tables under it are not chips
    assert len(result["chips"]) == count


def test_the_functions_of_one_pci_slot_are_one_chip() -> None:
    # tpu-info groups a TPU7x chip's two PCI functions by domain:bus:device (device.py, get_chips)
    text = "".join(f"0000:00:0{slot}.{fn}\n  vendor: 0x1ae0\n  device: 0x0076\n" for slot in (4, 5) for fn in (0, 1))
    result = parse_tpu_pci(text)
    assert (result["chip_count"], result["generation"], len(result["devices"])) == (2, "7x", 4)


@pytest.mark.parametrize(
    ("name", "generation", "count"),
    [
        # v5p-8 idle: the "Runtime Utilization Status" warning box follows the chip table
        ("tpu_v5p_4chip_tpuinfo_rich_idle_marinkb.txt", "v5p", 4),
        # the same host under load: a PID on every chip, HBM of 95.74 GiB, no warning box
        ("tpu_v5p_4chip_tpuinfo_rich_steady_marinkb.txt", "v5p", 4),
        # run from a debug pod without libtpu: "Libtpu version: unknown (libtpu not found)"
        ("tpu_v6e_4chip_tpuinfo_rich_nolibtpu_jimangel.txt", "v6e", 4),
        # a v6e-8 host: eight /dev/vfio nodes, the chip table alone
        ("tpu_v6e_8chip_tpuinfo_rich_chipsonly_eltsai.txt", "v6e", 8),
        # one chip, header lines padded with blanks to the terminal's width
        ("tpu_v6e_1chip_tpuinfo_rich_ljk.txt", "v6e", 1),
    ],
)
def test_tpu_info_tables_of_v5p_and_v6e_hosts(name: str, generation: str, count: int) -> None:
    result = parse_tpu_pci(fixture(name))
    assert (result["generation"], result["chip_count"], len(result["chips"])) == (generation, count, count)
    assert [chip["path"] for chip in result["chips"]] == [f"/dev/vfio/{i}" for i in range(count)]
    assert (result["devices"], result["nodes"]) == ([], [])


def test_a_chip_table_cut_by_a_narrow_terminal_asks_for_a_wider_one() -> None:
    # tpu-info in a 41-column terminal: "│ /dev/vf… │ TPU v6e  │ 1 │ 18297 │" and "│ │ chip │ │ │"
    with pytest.raises(ParseError) as error:
        parse_tpu_pci(fixture("tpu_v6e_1chip_tpuinfo_rich_narrow_wrapped_ljk.txt"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("tpu-info's TPU Chips table has 2 line(s) not of the form '/dev/vfio/0 | TPU v6e chip'")
    assert "/dev/vf…" in message
    assert message.endswith("run tpu-info with a wider terminal (COLUMNS=200 tpu-info)")


def test_a_chip_row_cut_among_whole_ones_is_not_counted_short() -> None:
    # one whole row and one cut row: counting the whole one alone would report a chip too few
    lines = fixture("tpu_v6e_4chip_tpuinfo_rich_nolibtpu_jimangel.txt").splitlines()
    cut = [line.replace("/dev/vfio/3 ", "/dev/vfi…  ") for line in lines]
    with pytest.raises(ParseError, match=r"has 1 line\(s\) not of the form"):
        parse_tpu_pci("\n".join(cut))
