"""``nvidia-smi -q`` Fabric sections from real hosts: joined, joining, refused and unhealthy."""

from __future__ import annotations

import pytest

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.nvidia_smi_fabric import parse_fabric
from kimi_deploy.parsers.nvidia_smi_query import NvidiaSmiFailure
from tests.parsers import fixture


def test_a_clique_member_whose_health_summary_is_unhealthy_is_not_ready() -> None:
    [fabric] = parse_fabric(fixture("fabric_mnnvl_completed_unhealthy_dra626.txt"))
    assert fabric == {
        "gpu": None,
        "state": "Completed",
        "status": "Success",
        "clique_id": 2,
        "cluster_uuid": "dc6e40c4-d722-4357-9ba6-5291dd461278",
        "health": {"Summary": "Unhealthy", "Bandwidth": "Full"},
        "ready": False,
    }


def test_a_fabric_still_in_progress_is_not_ready_and_its_na_values_are_none() -> None:
    [fabric] = parse_fabric(fixture("fabric_b200_inprogress_gpuop2511.txt"))
    assert (fabric["state"], fabric["status"], fabric["clique_id"], fabric["ready"]) == (
        "In Progress",
        None,
        None,
        False,
    )
    assert fabric["health"]["Route Unhealthy"] is None
    assert len(fabric["health"]) >= 7


def test_completed_with_insufficient_resources_is_not_ready() -> None:
    # an Azure Grace Blackwell VM the image's check refused, printed four columns to the left
    [fabric] = parse_fabric(fixture("fabric_gbfamily_completed_insufficientresources_azhpc506.txt"))
    assert (fabric["status"], fabric["clique_id"], fabric["ready"]) == ("Insufficient Resources", 0, False)
    assert fabric["cluster_uuid"] == "00000000-0000-0000-0000-000000000000"


def test_an_older_driver_prints_state_and_status_alone() -> None:
    text = "GPU 00000000:19:00.0\n" + fixture("fabric_h100_completed_success_gpud.txt")
    [fabric] = parse_fabric(text)
    assert (fabric["gpu"], fabric["state"], fabric["status"], fabric["ready"]) == (
        "00000000:19:00.0",
        "Completed",
        "Success",
        True,
    )
    assert (fabric["clique_id"], fabric["cluster_uuid"], fabric["health"]) == (None, None, {})


def test_crlf_does_not_change_the_result() -> None:
    text = fixture("fabric_mnnvl_completed_unhealthy_dra626.txt")
    assert parse_fabric(text.replace("\n", "\r\n")) == parse_fabric(text)


def test_a_failure_text_is_the_failure_and_other_text_is_refused() -> None:
    with pytest.raises(NvidiaSmiFailure, match="Unable to determine the device handle"):
        parse_fabric(fixture("query_error_device_handle_unknown_p4_synonv22.txt"))
    with pytest.raises(ParseError, match="no 'Fabric' section"):
        parse_fabric(fixture("topo_gb200x4_8nic_spaces_rhel4nv.txt"))


@pytest.mark.parametrize(
    ("name", "gpu"),
    [
        ("fabric_v100d8c_vgpu_na_535_docspks.txt", "00000000:02:00.0"),  # a licensed vGPU guest
        ("fabric_a10_passthrough_na_535_gpud.txt", "00000000:07:00.0"),  # a GPU passed through to a VM
    ],
)
def test_a_gpu_outside_any_nvlink_fabric_prints_na_and_is_not_ready(name: str, gpu: str) -> None:
    # a whole `nvidia-smi -q` report: the Fabric section is found under its GPU among the others
    [fabric] = parse_fabric(fixture(name))
    assert fabric == {
        "gpu": gpu,
        "state": None,
        "status": None,
        "clique_id": None,
        "cluster_uuid": None,
        "health": {},
        "ready": False,
    }
