"""The host probe of a converge, one process for all its parts: prints one tagged JSON line each.

Stdlib only, Python 3.10+. Input: one argument, base64 of zlib-compressed JSON:
  {"drivers": <driver_probe's request> (optional), "hardware": <hardware_probe's> (optional),
   "state": <state_probe's>}

Output, in this order, one line per part asked for: ``hardware <JSON>``, ``drivers <JSON>``,
``state <JSON>`` (``facts.host_state.KimiHostState`` reads them). The parts once ran as three
Python processes in one shell command; in one, a converged host's probe costs one interpreter
and its imports instead of three. A part that raises prints its traceback on stderr and no line
(the drivers and hardware parts answer ``{"error": ...}`` instead, as they do alone); the others
still answer, and the exit status is 1. nvidia-smi runs once per probe: the drivers part takes the
driver version from what the hardware part read (``driver_probe.driver_version_read``), and its
dpkg-query and systemctl where they were the same commands (``driver_probe.read_already``).
systemctl runs once too: one ``systemctl show`` of every part's units, started before the parts,
from which each part's answer is cut when it can be said exactly (hostside/unit_show.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading

from kimi_deploy.hostside import driver_probe, hardware_probe, state_probe
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.shared_queries import SERVICE_STATES
from kimi_deploy.hostside.unit_show import UnitShow

TYPE_CHECKING = False  # typing costs every probe several ms to import: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Answer = Callable[[dict[str, Any], dict[str, Any], "Shared"], Any]


class Shared:
    """What the parts share, read before them: the state part's ``Asked`` (None: it reads its
    own, and raises there if it must) and the one ``systemctl show`` of every part's units."""

    def __init__(self, request: dict[str, Any]) -> None:
        parts = {tag: (part if isinstance(part, dict) else {}) for tag, part in request.items()}
        self.asked: state_probe.Asked | None = None
        if "state" in parts:
            try:
                self.asked = state_probe.Asked(parts["state"])
            except Exception:  # noqa: BLE001 - the state part raises it again, in its place
                self.asked = None
        service_states = SERVICE_STATES[2].removeprefix("--property=").split(",")
        asks: list[tuple[list[str], list[str]]] = []
        if "hardware" in parts:
            asks.append((service_states, list(hardware_probe.SERVICES)))
        services = parts.get("drivers", {}).get("services")
        if isinstance(services, list) and services:
            asks.append((service_states, [str(u) for u in services]))
        if self.asked is not None and self.asked.units:
            asks.append((["Id", *state_probe.UNIT_PROPERTIES.split(",")], [str(u) for u in self.asked.units]))
        self.shown: UnitShow | None = None
        if len(asks) > 1:  # one part alone runs its own, as it always did
            timeout = parts.get("hardware", {}).get("timeout_s") or hardware_probe.COMMAND_TIMEOUT_S
            try:
                self.shown = UnitShow(asks, float(timeout))
            except (TypeError, ValueError):
                self.shown = None


# Part -> how it answers its request, given the parts answered before it and what they share,
# and what it answers when it raises (None: no line at all). In this order: the drivers part
# takes nvidia-smi's driver version from what the hardware part read just now, so that
# nvidia-smi runs once.
PARTS: dict[str, tuple[Answer, Callable[[Exception], Any] | None]] = {
    "hardware": (
        lambda part, _, shared: hardware_probe.probe(part, shared.shown),
        lambda exc: {"schema": 1, "error": f"{type(exc).__name__}: {exc}"},
    ),
    "drivers": (
        lambda part, before, shared: driver_probe.probe(
            part, driver_probe.driver_version_read(before.get("hardware")), before.get("hardware"), shared.shown
        ),
        lambda exc: {"error": f"{type(exc).__name__}: {exc}"},
    ),
    "state": (lambda part, _, shared: state_probe.probe(part, shared.asked, shared.shown), None),
}


def main() -> None:
    request = read_request()
    failed = False
    answers: dict[str, Any] = {}
    try:
        shared = Shared({tag: request[tag] for tag in PARTS if tag in request})
    except Exception:  # noqa: BLE001 - nothing shared: each part reads its own, as alone
        shared = Shared({})
    for tag, (probe, on_error) in PARTS.items():
        if tag not in request:
            continue
        part = request[tag]
        try:
            answer = probe(part if isinstance(part, dict) else {}, answers, shared)
        except Exception as exc:  # noqa: BLE001 - the other parts still answer
            import traceback  # noqa: PLC0415 - a failing part only

            traceback.print_exc()
            failed = True
            if on_error is None:
                continue
            answer = on_error(exc)
        answers[tag] = answer
        sys.stdout.write(f"{tag} {json.dumps(answer, sort_keys=True)}\n")
    sys.stdout.flush()
    if threading.active_count() > 1:
        # A thread still stuck in NVML (the hardware part) must not keep the SSH session alive.
        os._exit(1 if failed else 0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
