"""Fault drills: what ``deploys/drill.py`` runs on a host to inject one fault, and to clear it.

Pure: from the host's converge plan. Drills the deploy injects itself are the ones safe on a
production cluster (each is met by what already runs there: systemd, the watchdog, the router,
the gateway's fallback, the scrub):

- ``engine-killed``: SIGKILL to every process of the host's engine units; systemd starts them
  again (``Restart=on-failure``), the watchdog holds its checks while they load;
- ``engine-stopped``: the engines stopped as an operator stops them (the watchdog leaves a unit
  stopped on purpose alone); with every instance of a topology stopped, the gateway's hosted
  fallback answers; ``clear`` (or the next converge) starts them again;
- ``shard-corrupted``: one shard of the revision serving gets 64 bytes inverted in its middle,
  its size and mtime kept (silent corruption, which no cached check sees), then the weights scrub
  starts at once: it hashes every file, re-fetches the corrupted one, and the watchdog restarts
  the engines that read it;
- ``link-cut``: the host's link to one peer of its topology (host data ``kimi_drill_peer``, a host
  name; its router, say) cut: a blackhole route to the peer's address, so nothing the host sends
  it arrives (its answers to the router included), healed by ``clear`` or by itself after
  ``kimi_drill_for_s`` seconds (a systemd timer on the host: a cut that also took the controller's
  way in still heals). The routes are marked with their own routing protocol number, so ``clear``
  removes the drill's and no one else's.

Drills that need a hardware fault (an engine answering garbage, a GPU falling off the bus, a host
going down) are injected by the inventory's commands, host data ``kimi_drill_faults``
(``{NAME: {"inject": CMD, "clear": CMD}}``): the local cluster's inventory gives its fault
knobs there; a production inventory gives what its operators may safely do, or nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Literal

from kimi_deploy.converge.plan import Converge
from kimi_deploy.render.scrub_units import SCRUB_UNIT

# host data kimi_drill_faults: a drill's name -> its commands
Faults = Mapping[str, Mapping[Literal["inject", "clear"], str]]
BUILT_IN = ("engine-killed", "engine-stopped", "shard-corrupted", "link-cut")
CLEAR = "clear"
# A routing protocol number Linux's rtnetlink.h assigns to no routing daemon: the drill's routes.
ROUTE_PROTO = 77
HEAL_UNIT = "kimi-drill-heal"
# Inverts 64 bytes in the middle of a file, keeping its size and its times (silent corruption).
_FLIP = (
    "import os, sys; p = sys.argv[1]; st = os.stat(p); f = open(p, 'r+b'); f.seek(st.st_size // 2); "
    "b = f.read(64); f.seek(st.st_size // 2); f.write(bytes(255 - x for x in b)); f.close(); "
    "os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))"
)


class DrillError(ValueError):
    """A drill this host cannot run: one line naming the drill and why."""


def shard_of(todo: Converge) -> str:
    """The file ``shard-corrupted`` corrupts: the revision's first ``.safetensors`` file."""
    if todo.weights is None:
        raise DrillError("shard-corrupted: this host holds no weights")
    shards = sorted(p for p in todo.weights.lock if p.endswith(".safetensors"))
    if not shards:
        raise DrillError("shard-corrupted: the revision has no .safetensors file")
    return f"{todo.weights.path}/{shards[0]}"


def _cut(peer: str) -> str:
    """The route that cuts the link to ``peer`` (an address)."""
    family, length = ("-6 ", 128) if ":" in peer else ("", 32)
    return f"ip {family}route replace blackhole {peer}/{length} proto {ROUTE_PROTO}"


def link_cut(peer: str, for_s: int) -> list[str]:
    """Cut the link to ``peer``, healed after ``for_s`` seconds by a transient systemd timer."""
    heal = f"{HEAL_UNIT}-{peer.replace(':', '_')}"
    return [
        f"systemctl stop {heal}.timer 2>/dev/null || true",
        _cut(peer),
        f"systemd-run --quiet --collect --unit={heal} --on-active={for_s} {_cut(peer).replace(' replace ', ' del ')}",
    ]


# Every route the drill made, in both families, and the timers that would heal them.
HEAL_ALL = [
    f"ip route flush proto {ROUTE_PROTO}",
    f"ip -6 route flush proto {ROUTE_PROTO}",
    f"systemctl stop '{HEAL_UNIT}-*.timer' 2>/dev/null || true",
]


def drill_commands(
    drill: str, todo: Converge, engines: Sequence[str], faults: Faults, *, peer: str | None = None, for_s: int = 60
) -> list[str]:
    """The shell commands that inject ``drill`` (or, for ``clear``, clear every drill) on a host
    running ``engines``, whose inventory gives ``faults``; ``peer``: the address ``link-cut`` cuts
    the host from, for ``for_s`` seconds."""
    units = [f"{u}.service" for u in engines]
    if drill == CLEAR:
        return [
            *(faults[name]["clear"] for name in sorted(faults) if faults[name].get("clear")),
            *HEAL_ALL,
            *(["systemctl start " + " ".join(units)] if units else []),
        ]
    if drill in faults:
        if not faults[drill].get("inject"):
            raise DrillError(f"kimi_drill_faults.{drill}: no inject command")
        return [faults[drill]["inject"]]
    if drill not in BUILT_IN:
        known = ", ".join([*BUILT_IN, *sorted(faults), CLEAR])
        raise DrillError(f"kimi_drill: no drill {drill!r} on this host (it has {known})")
    if drill == "link-cut":
        if peer is None:
            raise DrillError("link-cut: no peer named: --data kimi_drill_peer=HOST (a host of this host's topology)")
        return link_cut(peer, for_s)
    if not units and drill != "shard-corrupted":
        raise DrillError(f"{drill}: this host runs no engine")
    if drill == "engine-killed":
        return [f"systemctl kill --signal=SIGKILL {' '.join(units)}"]
    if drill == "engine-stopped":
        return [f"systemctl stop {' '.join(units)}"]
    flip = f"python3 -c {shlex.quote(_FLIP)} {shlex.quote(shard_of(todo))}"
    return [flip, f"systemctl start --no-block {SCRUB_UNIT}.service"]
