"""The preflight gate's verdict on each real capture, read as the probe's answer would be.

A host's profile comes from the probe's raw answer through :func:`~kimi_deploy.host.profile.parse_profile`,
whose nvidia-smi path and TPU path run the parsers the captures are tested with: a capture that
parses is a host the accelerators gate judges. For each capture, a pool asking exactly what it
shows passes (where it shows a whole answer: count, model and memory), one asking a GPU or chip more
is refused in one line naming what was found, and a capture of nvidia-smi failing is refused naming
the failure. Each ``ibv_devinfo`` and ``ibstat`` capture, read into the probe's RDMA section as
``kimi-deploy facts check`` reads it, passes a pool asking an HCA whose port the tool printed
active, refuses one asking an HCA whose ports it printed in another state (naming the state) or did
not print, and the hardware report counts the same ports. Each nccl-tests all-reduce capture is
judged by the topology's all-reduce floor (``comm_check.all_reduce.min_busbw_gbs``): a clean run
passes a floor at what it measured at its largest size and is refused one above it; a run with
problems (wrong values, failures, no rows, no summary) is refused with its first problem whatever
the floor.
"""

from __future__ import annotations

import dataclasses

import pytest

from kimi_deploy.accelerators.tpu import tpu_model
from kimi_deploy.host.captured import nvidia_section, rdma_section, tpu_section
from kimi_deploy.host.preflight import Needs, accelerators, rdma
from kimi_deploy.host.profile import parse_profile
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.host.report_table import format_report
from kimi_deploy.inventory import Inventory
from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibstat import parse_ibstat
from kimi_deploy.parsers.ibv_devinfo import parse_ibv_devinfo
from kimi_deploy.parsers.nccl_tests import parse_nccl_tests, run_problems
from kimi_deploy.parsers.nvidia_smi_query import find_failure
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.serving.allreduce import nccl_verdict
from tests.conftest import RECIPE
from tests.parsers import FIXTURES, fixture
from tests.profiles import profile_of

QUERIES = sorted(p.name for p in FIXTURES.glob("query_*"))
# The --query-gpu lists of the captures printed without a header (SOURCES.md quotes the commands).
NOHEADER = {
    "query_h100nvl_noheader_akash91.csv": ["name", "pci.device_id"],
    "query_gb10_noheader_nounits_llamaswap782.csv": ["memory.used", "memory.total", "utilization.memory"],
}
TPUS = sorted(p.name for p in FIXTURES.glob("tpu_*"))
HCAS = sorted(p.name for p in FIXTURES.glob("ib*_*"))
ALL_REDUCES = sorted(p.name for p in FIXTURES.glob("nccl_allreduce_*"))
# An active port as each tool prints it; the gate reads the kernel's words (sysfs), as the probe does.
TOOL_ACTIVE = {"ibstat": "Active", "ibv-devinfo": "PORT_ACTIVE"}
KERNEL_STATES = {"DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}


@pytest.fixture(scope="module")
def b300(recipe: Recipe, prod: Inventory) -> HostPlan:
    return plan(recipe, RECIPE, prod).for_host("b300-01")


def _fields(name: str, text: str) -> list[str]:
    if name in NOHEADER:
        return NOHEADER[name]
    header = next(line for line in text.splitlines() if line.strip())
    return [cell.strip().split(" [")[0] for cell in header.split(",")]


def _verdict(recipe: Recipe, spec: HostPlan, profile: HostProfile) -> str | None:
    return accelerators(Needs(recipe, spec, 0, 0, []), profile)


@pytest.mark.parametrize("name", QUERIES)
def test_the_gate_judges_each_nvidia_smi_capture(recipe: Recipe, b300: HostPlan, name: str) -> None:
    text = fixture(name)
    failure = find_failure(text)
    fields = [] if failure else _fields(name, text)
    raw = {"nvidia": {"smi_query": {"stdout": text, "stderr": "", "rc": 18 if failure else 0}, "smi_fields": fields}}
    found = parse_profile(raw)["accelerators"]
    # ``kimi-deploy facts check`` reads the capture into the same profile
    assert parse_profile({"nvidia": nvidia_section(text, NOHEADER.get(name))})["accelerators"] == found
    if failure:
        assert (found["vendor"], found["count"], found["error"]) == ("nvidia", 0, failure["message"])
        assert _verdict(recipe, b300, profile_of(accelerators=found)) == (
            f"accelerators: pool {b300.pool} needs {b300.accelerators} x {b300.accelerator_model} with >= "
            f"{b300.accelerator_memory_gib} GiB, found an error: {failure['message']}"
        )
        return
    count, model, memory = found["count"], found["model"], found["memory_mib"]
    assert found["error"] is None
    assert count >= 1
    asked = dataclasses.replace(
        b300,
        accelerators=count,
        accelerator_model=model or "NVIDIA H200",
        accelerator_memory_gib=(memory or 1024) // 1024,
    )
    whole = model is not None and memory is not None
    shown = f"{count} x {model or 'none'}" + (f" ({memory // 1024} GiB)" if memory else "")
    want = f"with >= {asked.accelerator_memory_gib} GiB, found {shown}"
    # a pool asking what the capture shows: it passes when the capture tells the model and memory
    assert _verdict(recipe, asked, profile_of(accelerators=found)) == (
        None if whole else f"accelerators: pool {asked.pool} needs {count} x {asked.accelerator_model} {want}"
    )
    more = dataclasses.replace(asked, accelerators=count + 1)
    assert _verdict(recipe, more, profile_of(accelerators=found)) == (
        f"accelerators: pool {asked.pool} needs {count + 1} x {asked.accelerator_model} {want}"
    )


@pytest.mark.parametrize("name", TPUS)
def test_the_gate_judges_each_tpu_capture_the_probe_reads_as_pci(recipe: Recipe, b300: HostPlan, name: str) -> None:
    """The probe reads a TPU host's PCI ids from sysfs: a capture that lists them is a host the gate
    judges; one that lists nodes or tpu-info's table alone gives no profile (the probe reads neither)."""
    try:
        parsed = parse_tpu_pci(fixture(name))
    except ParseError:
        return
    pci = [{"address": d["pci_address"], "vendor": d["vendor_id"], "device": d["device_id"]} for d in parsed["devices"]]
    found = parse_profile({"tpu": {"pci": pci}})["accelerators"]
    if not parsed["devices"]:
        assert found["vendor"] == "none"
        return
    assert parse_profile({"tpu": tpu_section(fixture(name))})["accelerators"] == found
    assert (found["vendor"], found["count"]) == ("tpu", parsed["chip_count"])
    assert parsed["generation"] is not None
    model = tpu_model(parsed["generation"])
    asked = dataclasses.replace(b300, accelerator_vendor="tpu", accelerators=found["count"], accelerator_model=model)
    assert _verdict(recipe, asked, profile_of(accelerators=found)) is None
    more = dataclasses.replace(asked, accelerators=found["count"] + 1)
    assert _verdict(recipe, more, profile_of(accelerators=found)) == (
        f"accelerators: pool {asked.pool} needs {found['count'] + 1} x {model} with >= "
        f"{asked.accelerator_memory_gib} GiB, found {found['count']} x {model}"
    )


@pytest.fixture(scope="module")
def gb300(recipe: Recipe, prod: Inventory) -> HostPlan:
    return plan(recipe, RECIPE, prod).for_host("gb300-p01")  # KV cache over RDMA


@pytest.mark.parametrize("name", HCAS)
def test_the_rdma_gate_judges_each_hca_capture(recipe: Recipe, gb300: HostPlan, name: str) -> None:
    tool = "ibstat" if name.startswith("ibstat_") else "ibv-devinfo"
    try:
        section = rdma_section(fixture(name), tool)
    except ParseError:
        return  # no HCA block at all: the tool failed (one line, tests/parsers/test_whole_corpus.py)
    printed = {(p["device"], p["port"]): p["state"] for p in section["ports"]}
    ports = parse_profile({"rdma": section})["rdma"]
    # every state in the kernel's words; None where the capture does not print one (cut short)
    assert all(p["state"] in KERNEL_STATES or p["state"] is None for p in ports), [p["state"] for p in ports]
    assert all(p["device"] for p in ports)
    active = {str(p["device"]) for p in ports if p["state"] == "ACTIVE"}
    # the gate's ACTIVE is the tool's own active word, port by port
    assert {device for (device, _), state in printed.items() if state == "4: ACTIVE"} == active
    assert active == {hca for hca, port_state in _tool_states(name, tool) if port_state == TOOL_ACTIVE[tool]}

    def verdict(device: str) -> str | None:
        return rdma(Needs(recipe, gb300, 0, 0, [device]), profile_of(rdma=ports))

    for device in sorted(active):
        assert verdict(device) is None
    for device in sorted({str(p["device"]) for p in ports} - active):
        states = ", ".join(str(p["state"] or "state unknown") for p in ports if p["device"] == device)
        assert verdict(device) == f"RDMA: {device} needs an ACTIVE port for KV transfer, found {states}"
    assert verdict("mlx5_99") == "RDMA: mlx5_99 needs an ACTIVE port for KV transfer, found no such device"
    if ports:
        up = sum(1 for p in ports if p["state"] == "ACTIVE")
        rates = sorted({str(p["rate_gbps"]) for p in ports if p["state"] == "ACTIVE" and p["rate_gbps"] is not None})
        shown = f" {up}/{len(ports)} active" + (f" @{'/'.join(rates)}G" if rates else "") + " "
        assert shown in format_report({"h": profile_of(rdma=ports)})


def _tool_states(name: str, tool: str) -> list[tuple[str, str | None]]:
    """(HCA, port state) as the tool printed them, read straight from its parser's output."""
    if tool == "ibstat":
        return [(ca["name"], p["state"]) for ca in parse_ibstat(fixture(name))["cas"] for p in ca["ports"]]
    return [(hca["hca_id"], p["state"]) for hca in parse_ibv_devinfo(fixture(name)) for p in hca["ports"]]


def _with_floor(recipe: Recipe, topology: str, floor: float) -> Recipe:
    topo = recipe.topologies[topology]
    check = topo.comm_check.all_reduce
    assert check is not None
    comm = topo.comm_check.model_copy(update={"all_reduce": check.model_copy(update={"min_busbw_gbs": floor})})
    return recipe.model_copy(
        update={"topologies": {**recipe.topologies, topology: topo.model_copy(update={"comm_check": comm})}}
    )


@pytest.mark.parametrize("name", ALL_REDUCES)
def test_the_all_reduce_floor_judges_each_nccl_tests_capture(recipe: Recipe, b300: HostPlan, name: str) -> None:
    run = parse_nccl_tests(fixture(name))
    problems = run_problems(run)
    if problems:
        passed, failure = nccl_verdict(_with_floor(recipe, b300.topology, 0.001), b300, run)
        assert passed == ""
        assert failure is not None
        assert failure.endswith(problems[0])
        return
    largest = max(row["size_bytes"] for row in run["rows"])
    (row,) = [r for r in run["rows"] if r["size_bytes"] == largest]
    measured = min(row["out_of_place"]["busbw_gbs"], row["in_place"]["busbw_gbs"])
    if measured == 0:  # one rank: nothing crosses a bus, and no floor above 0 passes
        assert nccl_verdict(_with_floor(recipe, b300.topology, 1), b300, run)[1] is not None
        return
    passed, failure = nccl_verdict(_with_floor(recipe, b300.topology, measured), b300, run)
    assert failure is None
    assert passed.startswith(f"all-reduce: {measured:g} GB/s at ")
    assert f" over {len(run['ranks'])} ranks, needs >= {measured:g} GB/s" in passed
    _, failure = nccl_verdict(_with_floor(recipe, b300.topology, measured + 1), b300, run)
    assert failure is not None
    assert f"bus bandwidth {measured:g} GB/s at " in failure
    assert failure.endswith(f"needs >= {measured + 1:g} GB/s")
