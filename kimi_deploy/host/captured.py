"""A HostProfile from command outputs captured on a host, read as the probe's answer would be.

``kimi-deploy facts check`` judges a host by what an operator captured on it (``nvidia-smi
--query-gpu``, a TPU host's PCI listing, ``ibv_devinfo`` or ``ibstat``, nccl-tests'
``all_reduce_perf``) with the same gates a deploy runs. The outputs go through the parsers into
the sections of the probe's raw answer and then through
:func:`~kimi_deploy.host.profile.parse_profile`, so what the gate sees of a capture is what it
would see of the probe on that host:

- ``nvidia-smi --query-gpu``: the probe's ``nvidia.smi_query`` with the capture's header (or the
  ``--query-gpu`` list given for a ``noheader`` one) as its fields; nvidia-smi's failure texts are
  the profile's error, as on a host.
- a TPU host's PCI listing: the devices' addresses and ids, as the probe reads them from sysfs; a
  listing that shows no PCI ids (``/dev/accel*`` names, tpu-info's table) gives no TPU profile and
  says so, since the probe never reads those.
- ``ibv_devinfo`` / ``ibstat``: each port in the form the kernel's sysfs prints it
  (``/sys/class/infiniband/<hca>/ports/<n>/state`` reads ``4: ACTIVE``), the form the probe reads.
  The state words of both tools are the InfiniBand port states (IBTA: 1 Down, 2 Init, 3 Armed,
  4 Active), as libibverbs' ``ibv_port_state_str`` (``PORT_ACTIVE``) and infiniband-diags'
  ``ibstat`` (``Active``) print them; a word neither prints is kept as printed.

Raises :class:`~kimi_deploy.parsers.ParseError` (one line) when a capture is not its command's output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from kimi_deploy.hostside.probe_types import RdmaPort, RdmaSection
from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibstat import IbstatPort, parse_ibstat
from kimi_deploy.parsers.ibv_devinfo import IbvPort, parse_ibv_devinfo
from kimi_deploy.parsers.nccl_tests import NcclTestsRun, parse_nccl_tests
from kimi_deploy.parsers.nvidia_smi_query import find_failure, parse_query
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci


class CapturedRun(TypedDict):
    """A captured output as the probe's record of a command run (``CommandRun``): its output, of a
    run that exited 0; a capture has no argv or error to give."""

    stdout: str
    stderr: str
    rc: int


class CapturedNvidia(TypedDict):
    """The keys of the probe's ``nvidia`` section (``NvidiaSection``) a ``--query-gpu`` capture gives."""

    smi_query: CapturedRun
    smi_fields: list[str]


class CapturedPci(TypedDict):
    """A PCI device as the probe reads it from sysfs (``PciDevice``)."""

    address: str
    vendor: str
    # None: the listing printed the device's vendor and not its device id (the probe reads both)
    device: str | None


class CapturedTpu(TypedDict):
    """The key of the probe's ``tpu`` section (``TpuSection``) a PCI listing gives."""

    pci: list[CapturedPci]


# What a capture stands for: the part of a probe section it gives, or an all-reduce run.
Section = CapturedNvidia | CapturedTpu | RdmaSection | NcclTestsRun

# The port state as each tool prints it -> the kernel's "code: NAME" (drivers/infiniband/core/sysfs.c).
_STATES = {
    "PORT_DOWN": "1: DOWN",
    "PORT_INIT": "2: INIT",
    "PORT_ARMED": "3: ARMED",
    "PORT_ACTIVE": "4: ACTIVE",
    "PORT_ACTIVE_DEFER": "5: ACTIVE_DEFER",
    "Down": "1: DOWN",
    "Initializing": "2: INIT",
    "Armed": "3: ARMED",
    "Active": "4: ACTIVE",
}
# The physical state as each tool prints it -> the kernel's "code: Name".
_PHYS_STATES = {
    "SLEEP": "1: Sleep",
    "POLLING": "2: Polling",
    "DISABLED": "3: Disabled",
    "PORT_CONFIGURATION TRAINING": "4: PortConfigurationTraining",
    "LINK_UP": "5: LinkUp",
    "LINK_ERROR_RECOVERY": "6: LinkErrorRecovery",
    "PHY TEST": "7: Phy Test",
    "Sleep": "1: Sleep",
    "Polling": "2: Polling",
    "Disabled": "3: Disabled",
    "PortConfigurationTraining": "4: PortConfigurationTraining",
    "LinkUp": "5: LinkUp",
    "LinkErrorRecovery": "6: LinkErrorRecovery",
    "PhyTest": "7: Phy Test",
}


def nvidia_section(text: str, fields: list[str] | None) -> CapturedNvidia:
    """The probe's ``nvidia`` section for a ``--query-gpu`` capture."""
    if find_failure(text):
        # nvidia-smi printed a failure instead of a table: the probe's answer holds it as it is
        return {"smi_query": {"stdout": text, "stderr": "", "rc": 0}, "smi_fields": []}
    rows = parse_query(text, fields)
    names = fields if fields is not None else list(rows[0])
    return {"smi_query": {"stdout": text, "stderr": "", "rc": 0}, "smi_fields": names}


def tpu_section(text: str) -> CapturedTpu:
    """The probe's ``tpu`` section for a PCI listing of a TPU host."""
    parsed = parse_tpu_pci(text)
    if parsed["chip_count"] and not parsed["devices"]:
        raise ParseError(
            f"shows {parsed['chip_count']} TPU chips without their PCI ids: the gate judges a listing "
            "with them (lspci -nn, or sysfs's vendor and device files)"
        )
    pci: list[CapturedPci] = [
        {"address": d["pci_address"], "vendor": d["vendor_id"], "device": d["device_id"]} for d in parsed["devices"]
    ]
    return {"pci": pci}


def all_reduce_run(text: str) -> NcclTestsRun:
    """An nccl-tests run of ``all_reduce_perf`` (not a probe section: the all-reduce check measures
    what it does); a run of another collective is refused."""
    run = parse_nccl_tests(text)
    if run["test"] not in (None, "all_reduce_perf"):
        raise ParseError(f"a run of {run['test']}, not of all_reduce_perf")
    if run["rows"] and all(row["redop"] == "none" for row in run["rows"]):
        # nccl-tests before 2.17 name no test; its collectives that reduce nothing print redop none
        raise ParseError("its rows reduce nothing (redop none): a run of another collective than all_reduce_perf")
    return run


def rdma_section(text: str, tool: str) -> RdmaSection:
    """The probe's ``rdma`` section for an ``ibv_devinfo`` or ``ibstat`` capture (``tool``)."""
    ports: list[RdmaPort] = []
    if tool == "ibv-devinfo":
        for hca in parse_ibv_devinfo(text):
            for port in hca["ports"]:
                ports.append(_port(hca["hca_id"], port, _ibv_rate(port)))
    else:
        for ca in parse_ibstat(text)["cas"]:
            for ca_port in ca["ports"]:
                rate = ca_port["rate"]
                ports.append(_port(ca["name"], ca_port, None if rate is None else f"{rate} Gb/sec"))
    return {"ports": ports}


def _port(device: str, port: IbvPort | IbstatPort, rate: str | None) -> RdmaPort:
    state, phys = port["state"], port["physical_state"]
    return {
        "device": device,
        "port": str(port["port"]),
        "state": None if state is None else _STATES.get(state, state),
        "phys_state": None if phys is None else _PHYS_STATES.get(phys, phys),
        "rate": rate,
        "link_layer": port["link_layer"],
    }


def _ibv_rate(port: IbvPort) -> str | None:
    """``ibv_devinfo -v``'s active_width x active_speed (``4X`` x ``25.0 Gbps``) as sysfs's rate."""
    width, speed = port["active_width"] or "", port["active_speed"] or ""
    lanes, per_lane = width.removesuffix("X"), speed.split(" ", maxsplit=1)[0]
    if not lanes.isdecimal() or not speed.endswith("Gbps") or not per_lane.replace(".", "", 1).isdecimal():
        return None
    total = int(lanes) * float(per_lane)
    return f"{total:g} Gb/sec"


@dataclass(frozen=True)
class Capture:
    """A command output ``facts check`` takes (``--nvidia-smi-query FILE``, by its name here)."""

    gate: str  # the preflight gate it informs (a gate of preflight.GATES by name), or "all-reduce"
    section: str  # the section of the probe's answer it stands for
    read: Callable[[str, list[str] | None], Section]  # (text, --fields) -> that section


def _all_reduce(text: str, fields: list[str] | None) -> NcclTestsRun:
    return all_reduce_run(text)


def _tpu(text: str, fields: list[str] | None) -> CapturedTpu:
    return tpu_section(text)


def _rdma(tool: str) -> Callable[[str, list[str] | None], RdmaSection]:
    def read(text: str, fields: list[str] | None) -> RdmaSection:
        return rdma_section(text, tool)

    return read


CAPTURES: Mapping[str, Capture] = {
    "nvidia_smi_query": Capture("accelerators", "nvidia", nvidia_section),
    "tpu_pci": Capture("accelerators", "tpu", _tpu),
    "ibv_devinfo": Capture("rdma", "rdma", _rdma("ibv-devinfo")),
    "ibstat": Capture("rdma", "rdma", _rdma("ibstat")),
    # not a probe section: the all-reduce check measures what nccl-tests does, before engines start
    "nccl_all_reduce": Capture("all-reduce", "nccl", _all_reduce),
}
