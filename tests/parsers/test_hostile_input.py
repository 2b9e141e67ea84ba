"""Outputs a host can craft: every parser answers a line it cannot read with one ``ParseError``
line, in time linear in its input, and the host profile leaves out what is not in sysfs's form.

The outputs come from hosts (the probes print them, or a host's agent was replaced): a parser runs
on the controller, so a number past Python's 4300-digit limit or a 100 KB line built to make a
pattern backtrack must neither raise another exception nor stall a deploy.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from kimi_deploy.host.profile import parse_profile
from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibstat import parse_ibstat
from kimi_deploy.parsers.ibv_devinfo import parse_ibv_devinfo
from kimi_deploy.parsers.nccl_tests import parse_nccl_tests
from kimi_deploy.parsers.nvidia_smi_query import parse_query
from kimi_deploy.parsers.nvidia_smi_topo import parse_topo
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci
from tests.conftest import ROOT
from tests.parsers import fixture

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

BIG = "9" * 5000  # past sys.get_int_max_str_digits(): int() raises ValueError

# (parser, an output whose one number is BIG, what the line names)
HUGE_NUMBERS: list[tuple[str, Callable[[str], Any], str, str]] = [
    ("ibstat-port", parse_ibstat, f"CA 'mlx5_0'\n\tCA type: MT4129\n\tPort {BIG}:\n\t\tState: Active\n", "Port"),
    ("ibstat-lid", parse_ibstat, f"CA 'mlx5_0'\n\tPort 1:\n\t\tBase lid: {BIG}\n", "Base lid"),
    ("ibv-port", parse_ibv_devinfo, f"hca_id:\tmlx5_0\n\tport:\t{BIG}\n", "port"),
    ("ibv-mtu", parse_ibv_devinfo, f"hca_id:\tmlx5_0\n\tport:\t1\n\t\tmax_mtu:\t\t{BIG} (5)\n", "max_mtu"),
    ("nvidia-smi-query", parse_query, f"index, memory.total [MiB]\n0, {BIG} MiB\n", "memory.total"),
    ("nvidia-smi-topo", parse_topo, f"\tGPU{BIG}\nGPU{BIG}\t X \n", "header column"),
    ("tpu-pci-node", parse_tpu_pci, f"crw-rw-rw- 1 root root {BIG}, 2 Jul 29 18:29 /dev/accel0\n", "/dev/accel0"),
    ("tpu-pci-iommu", parse_tpu_pci, f"/sys/kernel/iommu_groups/{BIG}/devices/0000:00:04.0\n", "iommu_groups"),
    ("nccl-config", parse_nccl_tests, f"# nThread 1 nGpus {BIG} minBytes 8 maxBytes 8 step: 2(factor)\n", "nGpus"),
    ("nccl-row", parse_nccl_tests, f"{BIG} 2 float sum -1 1.0 1.0 1.0 0 1.0 1.0 1.0 0\n", "size"),
    ("nccl-rank", parse_nccl_tests, f"#  Rank  0 Group  0 Pid {BIG} on h1 device  0 [0x1a] NVIDIA H200\n", "Pid"),
]


@pytest.mark.parametrize(("parse", "text", "names"), [pytest.param(p, t, n, id=i) for i, p, t, n in HUGE_NUMBERS])
def test_a_5000_digit_number_is_one_parse_error_line(parse: Callable[[str], Any], text: str, names: str) -> None:
    with pytest.raises(ParseError) as info:
        parse(text)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert names in message
    assert "a number of 5000 digits, longer than any a hardware tool prints" in message
    assert len(message) <= 420


def test_the_facts_cli_answers_a_5000_digit_number_with_one_line(tmp_path: Any) -> None:
    capture = tmp_path / "ibstat.txt"
    capture.write_text(f"CA 'mlx5_0'\n\tPort 1:\n\t\tBase lid: {BIG}\n", encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "kimi_pyinfra.cli", "facts", "parse", "--kind", "ibstat", str(capture)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        f"{capture}: ibstat: CA mlx5_0: Base lid: a number of 5000 digits, longer than any a hardware tool prints\n"
    )


N = 100_000
# Lines built to make the former patterns backtrack: seconds to minutes each at 100 KB.
CRAFTED = {
    "tpu-heading-dashes": ("tpu_pci", "parse_tpu_pci", "'/dev/a' + '-' * N + 'x'"),
    "ibv-blanks-no-colon": ("ibv_devinfo", "parse_ibv_devinfo", "'hca_id: x\\n' + ' ' * N + 'x'"),
    "ibv-key-blanks": ("ibv_devinfo", "parse_ibv_devinfo", "'hca_id: x\\na' + ' ' * N + 'b'"),
    "ibv-value-blanks": ("ibv_devinfo", "parse_ibv_devinfo", "'hca_id: x\\na:' + ' ' * N + 'b' + ' ' * N + 'c'"),
    "ibv-enum-blanks": ("ibv_devinfo", "parse_ibv_devinfo", "'hca_id: x\\n port: 1\\n  state: a' + ' ' * N + '('"),
    "tpu-lspci-names": ("tpu_pci", "parse_tpu_pci", "'00:04.0 ' + 'a ' * N + ': Google, Inc. ' + 'Device ' * N"),
    "tpu-info-cells": ("tpu_pci", "parse_tpu_pci", "'| /dev/vfio/0 |' + ' TPU' * N + ' chip |'"),
    "fabric-blanks": ("nvidia_smi_fabric", "parse_fabric", "'Fabric\\n  State' + ' ' * N + ': ' + 'x' * N"),
    "query-header-cells": ("nvidia_smi_query", "parse_query", "'name [' + '[' * N + '\\n'"),
}


@pytest.mark.parametrize(("module", "function", "text"), list(CRAFTED.values()), ids=list(CRAFTED))
def test_a_100_kb_crafted_line_does_not_hang_the_parser(module: str, function: str, text: str) -> None:
    """Run in a process of its own with a generous deadline: linear parsers take milliseconds."""
    program = textwrap.dedent(f"""
        from kimi_deploy.parsers import ParseError
        from kimi_deploy.parsers.{module} import {function}
        N = {N}
        try:
            {function}({text})
        except ParseError:
            pass
    """)
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_the_rewritten_readers_read_headings_and_enumerations_as_before() -> None:
    v6e = parse_tpu_pci(fixture("tpu_v6e_vfio_sysfs_ray65105.txt"))
    assert (v6e["generation"], v6e["chip_count"], len(v6e["nodes"])) == ("v6e", 4, 4)
    assert parse_tpu_pci("/dev/vfio/:\ncrw-rw-rw- 1 root root 245, 2 Jul 29 18:29 0\n")["nodes"] == [
        {"path": "/dev/vfio/0", "major": 245, "minor": 2}
    ]
    (hca,) = parse_ibv_devinfo(fixture("ibv_devinfo_v_cx5_roce_spaces_martins3.txt"))[:1]
    assert hca["ports"][0]["state"] == "PORT_ACTIVE"
    assert hca["ports"][0]["max_mtu"] == 4096


# ---- the host profile: a hostile host's probe answer ---------------------------------------------

TPU_ENTRY = {"address": "0000:00:04.0", "vendor": "0x1ae0", "device": "0x0076"}


def _tpu_probe(*entries: Any) -> dict[str, Any]:
    return {"tpu": {"pci": list(entries), "nodes": [], "metadata": None}}


def test_a_reported_pci_address_cannot_add_devices() -> None:
    """An address carrying line breaks would have become lines of the listing: four more TPU chips."""
    forged = "0000:00:05.0\n" + "".join(f"0000:00:0{i}.0\n  vendor: 0x1ae0\n  device: 0x0076\n" for i in range(6, 10))
    profile = parse_profile(_tpu_probe(TPU_ENTRY, {**TPU_ENTRY, "address": forged}))
    accelerators = profile["accelerators"]
    assert (accelerators["vendor"], accelerators["count"], accelerators["model"]) == ("tpu", 1, "TPU7x")
    assert [d["pci_address"] for d in accelerators["devices"]] == ["0000:00:04.0"]
    assert profile["errors"]["tpu.pci"] == "1 PCI entries not in sysfs's form (address, vendor, device)"


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({**TPU_ENTRY, "address": "0" * N}, id="100-kb-address"),
        pytest.param({**TPU_ENTRY, "vendor": "0x1ae0\n  device: 0x0076"}, id="vendor-with-a-line"),
        pytest.param({**TPU_ENTRY, "device": 118}, id="device-not-text"),
        pytest.param("0000:00:04.0", id="entry-not-a-mapping"),
    ],
)
def test_a_malformed_pci_entry_is_left_out_and_said(entry: Any) -> None:
    profile = parse_profile(_tpu_probe(entry))
    assert profile["accelerators"]["vendor"] == "none"
    assert profile["errors"]["tpu.pci"] == "1 PCI entries not in sysfs's form (address, vendor, device)"


def test_huge_numbers_in_a_probe_answer_read_as_unknown() -> None:
    raw = {
        "host": {"numa_nodes": BIG, "meminfo": {"MemTotal": f"{BIG} kB"}},
        "rdma": {"ports": [{"device": "mlx5_0", "port": BIG, "state": f"{BIG}: ACTIVE", "rate": f"{BIG} Gb/sec"}]},
        "tpu": {"pci": [TPU_ENTRY], "metadata": {"agent-worker-number": BIG}},
        "disk": {"read": {"bytes": 10**400, "seconds": 1}},
    }
    profile = parse_profile(raw)
    assert profile["numa_nodes"] == 1
    assert profile["memory"]["total_bytes"] is None
    assert profile["rdma"] == [
        {"device": "mlx5_0", "port": None, "state": "ACTIVE", "phys_state": None, "rate_gbps": None, "link_layer": None}
    ]
    tpu = profile["accelerators"]["tpu"]
    assert tpu is not None
    assert tpu["worker"] is None
    assert profile["disk"]["read_mb_s"] is None
    assert profile["errors"]["disk.read"] == "the read measurement is not a number of bytes and seconds"


def test_a_sysfs_state_with_a_100_kb_tail_is_read_in_linear_time() -> None:
    program = (
        "from kimi_deploy.host.profile import parse_profile\n"
        f"s = '4: ACTIVE' + ' ' * {N} + 'x'\n"
        "p = parse_profile({'rdma': {'ports': [{'device': 'mlx5_0', 'port': '1', 'state': s}]}})\n"
        "assert p['rdma'][0]['state'].startswith('ACTIVE')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
