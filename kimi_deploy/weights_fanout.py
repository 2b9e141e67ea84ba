"""Download once, fan out: who fetches a revision from the Hub, who from peers, who serves.

Pure: decided on the controller from every host's probe before any change. Hosts that want the
same files (same repository, revision and folder) form a group. In a group, hosts that already
hold every file verified are sources. If there is none, the first host that needs files fetches
them from the Hub and becomes the source. Every other host that needs files fetches them from the
sources (each starting at another source, to spread the load) and falls back to the Hub only for
what no source could give. A host re-hashing everything (full verify) uses the Hub and is no
source: its cached verdicts are what it distrusts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from hostside.probe_types import WeightsFound


@dataclass(frozen=True)
class WeightsHost:
    """One host of the run as the fan-out sees it."""

    name: str
    address: str
    # repository, revision and folder of the files it wants (None: it holds no weights)
    wants: tuple[str, str, str] | None
    # the port its sources serve on (the recipe's weights.fan_out.port), None: Hub only
    port: int | None
    # the probe's verdict on its folder (``exists``, ``missing``, ``unverified``, ``extra``)
    found: WeightsFound | None
    full_verify: bool = False


@dataclass(frozen=True)
class Source:
    host: str
    address: str


@dataclass(frozen=True)
class FanOutPart:
    """One host's part: how it syncs (``hub``, ``peers`` or not at all) and whom it serves."""

    sync: Literal["hub", "peers"] | None
    peers: tuple[Source, ...] = ()
    serves: tuple[str, ...] = field(default=())  # addresses allowed to fetch from this host


def needs_files(found: WeightsFound | None) -> bool:
    return found is None or not found.get("exists") or bool(found.get("missing") or found.get("unverified"))


def needs_sync(found: WeightsFound | None) -> bool:
    """Whether the sync has anything to do: files to fetch or verify, or extra files to remove."""
    return needs_files(found) or bool(found and found.get("extra"))


def plan_fan_out(hosts: Sequence[WeightsHost]) -> dict[str, FanOutPart]:
    """Each host's part, by name (hosts in run order; the order decides the Hub's one host)."""
    parts: dict[str, FanOutPart] = {}
    groups: dict[tuple[str, str, str, int | None], list[WeightsHost]] = {}
    for h in hosts:
        if h.wants is None:
            parts[h.name] = FanOutPart(None)
            continue
        groups.setdefault((*h.wants, h.port), []).append(h)
    for (*_, port), members in groups.items():
        enabled = port is not None
        fetchers = [h for h in members if needs_files(h.found) and not h.full_verify]
        for h in members:
            if h.full_verify or (needs_sync(h.found) and not needs_files(h.found)):
                parts[h.name] = FanOutPart("hub")  # re-hash everything, or only clean up
            elif not needs_files(h.found):
                parts[h.name] = FanOutPart(None)
        if not fetchers:
            continue
        if not enabled:
            parts.update({h.name: FanOutPart("hub") for h in fetchers})
            continue
        ready = [h for h in members if not needs_files(h.found) and not h.full_verify]
        if not ready:
            seed, fetchers = fetchers[0], fetchers[1:]
            ready = [seed]
            parts[seed.name] = FanOutPart("hub")
        sources = [Source(h.name, h.address) for h in ready]
        for i, h in enumerate(fetchers):
            turn = i % len(sources)
            parts[h.name] = FanOutPart("peers", tuple(sources[turn:] + sources[:turn]))
        if fetchers:
            allowed = tuple(h.address for h in fetchers)
            for h in ready:
                parts[h.name] = FanOutPart(parts[h.name].sync, (), allowed)
    return parts
