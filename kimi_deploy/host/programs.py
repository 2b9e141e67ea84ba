"""The programs the controller runs on hosts (``hostside/``), named once.

Each is a ``HostProgram``: its script, and the command that runs it with a host's Python and one
request (``hostside.request.read_request`` reads it there). Callers name the program, never its
file; ``tests/test_host_request.py`` holds that every program with a ``main`` is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kimi_deploy.host.command import bundle, hostside_command


@dataclass(frozen=True)
class HostProgram:
    script: str  # hostside/<script>

    def command(self, python: str, request: Mapping[str, Any]) -> str:
        """The shell command running the program with ``python`` on the host, in one round-trip."""
        return hostside_command(python, self.script, request)

    def source(self) -> str:
        """The program as one Python source, for a file a converge writes (a unit runs it)."""
        return bundle(self.script)


# probes
HOST_PROBE = HostProgram("host_probe.py")  # the converge's probe: hardware, drivers and state in one process
HARDWARE_PROBE = HostProgram("hardware_probe.py")
DRIVER_PROBE = HostProgram("driver_probe.py")
STATE_PROBE = HostProgram("state_probe.py")
# the converge's steps
VENV_INSTALL = HostProgram("venv_install.py")
WEIGHTS_SYNC = HostProgram("weights_sync.py")  # also the scrub timer's program
WEIGHTS_PEER = HostProgram("weights_peer.py")
COMMCHECK = HostProgram("commcheck.py")
ALLREDUCE = HostProgram("allreduce.py")
SMOKE = HostProgram("smoke.py")
ROUTER_VIEW = HostProgram("router_view.py")
ROUTER_DRAIN = HostProgram("router_drain.py")
# the watchdog unit's program
WATCHDOG = HostProgram("watchdog.py")
# the context ladder and the serving benchmark
LADDER = HostProgram("ladder.py")
BENCH_LOAD = HostProgram("bench_load.py")
BENCH_RECORD = HostProgram("bench_record.py")

PROGRAMS = (
    HOST_PROBE,
    HARDWARE_PROBE,
    DRIVER_PROBE,
    STATE_PROBE,
    VENV_INSTALL,
    WEIGHTS_SYNC,
    WEIGHTS_PEER,
    COMMCHECK,
    ALLREDUCE,
    SMOKE,
    ROUTER_VIEW,
    ROUTER_DRAIN,
    WATCHDOG,
    LADDER,
    BENCH_LOAD,
    BENCH_RECORD,
)
