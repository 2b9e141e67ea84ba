"""The programs the controller runs on hosts (``hostside/``), named once.

Each is a ``HostProgram``: its script, and the command that runs it with a host's Python and one
request (``hostside.request.read_request`` reads it there). Callers name the program, never its
file; ``tests/test_host_request.py`` holds that every program with a ``main`` is here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kimi_deploy.benchmark.types import BenchRecordRequest, BenchRequest
from kimi_deploy.host.command import bundle, hostside_command
from kimi_deploy.hostside.requests import (
    AllReduceRequest,
    ColdStartRecordRequest,
    CommCheckPhase,
    CompileCachePackRequest,
    CompileCachePlaceRequest,
    DrainRequest,
    DriversRequest,
    HardwareRequest,
    HostProbeRequest,
    LadderRequest,
    PeerRequest,
    RouterViewRequest,
    SmokeRequest,
    StateRequest,
    SyncRequest,
    VenvInstallRequest,
    WatchdogConfig,
)

Request = TypeVar("Request")


@dataclass(frozen=True)
class HostProgram(Generic[Request]):
    """A program of ``hostside/`` and the type of its request (``kimi_deploy.hostside.requests``)."""

    script: str  # hostside/<script>
    # it imports the standard library alone and runs on the host's own Python: started isolated
    # (``hostside_command``); a program run by a release's Python (the weights sync) needs its site
    isolated: bool = False

    def command(self, python: str, request: Request, kept: bool = False) -> str:
        """The shell command running the program with ``python`` on the host, in one round-trip
        (``kept``: its compiled copy kept there, ``hostside_command``)."""
        return hostside_command(python, self.script, request, kept, self.isolated)

    def source(self) -> str:
        """The program as one Python source, for a file a converge writes (a unit runs it)."""
        return bundle(self.script)


# probes
# the converge's probe: hardware, drivers and state in one process
HOST_PROBE: HostProgram[HostProbeRequest] = HostProgram("host_probe.py", isolated=True)
HARDWARE_PROBE: HostProgram[HardwareRequest] = HostProgram("hardware_probe.py")
DRIVER_PROBE: HostProgram[DriversRequest] = HostProgram("driver_probe.py")
STATE_PROBE: HostProgram[StateRequest] = HostProgram("state_probe.py")
# the converge's steps
VENV_INSTALL: HostProgram[VenvInstallRequest] = HostProgram("venv_install.py")
WEIGHTS_SYNC: HostProgram[SyncRequest] = HostProgram("weights_sync.py")  # also the scrub timer's program
WEIGHTS_PEER: HostProgram[PeerRequest] = HostProgram("weights_peer.py")
COMPILE_CACHE_PACK: HostProgram[CompileCachePackRequest] = HostProgram("compile_cache_pack.py")
COMPILE_CACHE_PLACE: HostProgram[CompileCachePlaceRequest] = HostProgram("compile_cache_place.py")
COMMCHECK: HostProgram[CommCheckPhase] = HostProgram("commcheck.py")
ALLREDUCE: HostProgram[AllReduceRequest] = HostProgram("allreduce.py")
SMOKE: HostProgram[SmokeRequest] = HostProgram("smoke.py")
ROUTER_VIEW: HostProgram[RouterViewRequest] = HostProgram("router_view.py")
ROUTER_DRAIN: HostProgram[DrainRequest] = HostProgram("router_drain.py")
# the watchdog unit's program (its request: the config file it reads)
WATCHDOG: HostProgram[WatchdogConfig] = HostProgram("watchdog.py")
# the context ladder and the serving benchmark
LADDER: HostProgram[LadderRequest] = HostProgram("ladder.py")
BENCH_LOAD: HostProgram[BenchRequest] = HostProgram("bench_load.py")
BENCH_RECORD: HostProgram[BenchRecordRequest] = HostProgram("bench_record.py")
# a converge's cold start, into the serving release's record
COLD_START_RECORD: HostProgram[ColdStartRecordRequest] = HostProgram("cold_start_record.py")

# every program, whatever its request
PROGRAMS: tuple[HostProgram[Any], ...] = (
    HOST_PROBE,
    HARDWARE_PROBE,
    DRIVER_PROBE,
    STATE_PROBE,
    VENV_INSTALL,
    WEIGHTS_SYNC,
    WEIGHTS_PEER,
    COMPILE_CACHE_PACK,
    COMPILE_CACHE_PLACE,
    COMMCHECK,
    ALLREDUCE,
    SMOKE,
    ROUTER_VIEW,
    ROUTER_DRAIN,
    WATCHDOG,
    LADDER,
    BENCH_LOAD,
    BENCH_RECORD,
    COLD_START_RECORD,
)
