"""Download once, fan out as a pipeline: who fetches a revision from the Hub, who from which peer.

Pure: decided on the controller from every host's probe before any change. Hosts that want the
same files (same repository, revision and folder) form a group. In a group, hosts that already
hold every file verified are sources. If there is none, the first host that needs files fetches
them from the Hub and becomes the source. Every other host that needs files joins a chain that
starts at a source: it fetches from the host before it while that host is still receiving
(``hostside/weights_peer.py`` relays a file as it arrives and releases its last bytes once the
whole file matched the lock), so W bytes reach N hosts in about W / link rate plus a small delay
per hop, where a star (everyone from one source) takes N x W / rate. With several sources, the
fetchers are dealt over as many chains.

A host that cannot give a file (down, or its own copy failed) is passed over for the hosts before
it in its chain, then the chain's source, then the other sources (``UPSTREAM`` and ``SOURCES``
bound the list, so a host's part does not grow with the run); the Hub only for what none of them
could give. A host re-hashing everything (full verify) uses the Hub and is no source: its cached
verdicts are what it distrusts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from kimi_deploy.hostside.probe_types import WeightsFound

# How many hosts before it in its chain a fetcher may fall back to, and how many sources after.
UPSTREAM = 3
SOURCES = 2


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
    """One host's part: how it syncs (``hub``, ``peers`` or not at all), from whom in turn, and
    whom it serves (as its files arrive, when it syncs too)."""

    sync: Literal["hub", "peers"] | None
    peers: tuple[Source, ...] = ()
    serves: tuple[str, ...] = field(default=())  # addresses allowed to fetch from this host


def needs_files(found: WeightsFound | None) -> bool:
    return found is None or not found.get("exists") or bool(found.get("missing") or found.get("unverified"))


def needs_sync(found: WeightsFound | None) -> bool:
    """Whether the sync has anything to do: files to fetch or verify, or extra files to remove."""
    return needs_files(found) or bool(found and found.get("extra"))


def chains(sources: Sequence[Source], fetchers: Sequence[Source]) -> dict[Source, tuple[Source, ...]]:
    """Each fetcher's sources in the order it tries them: the host before it in its chain first.
    Fetchers are dealt over one chain per source, in run order."""
    lines: list[list[Source]] = [[s] for s in sources]
    for i, f in enumerate(fetchers):
        lines[i % len(lines)].append(f)
    tried: dict[Source, tuple[Source, ...]] = {}
    for j, line in enumerate(lines):
        others = [*sources[j + 1 :], *sources[:j]][:SOURCES]
        for p in range(1, len(line)):
            before = line[max(1, p - UPSTREAM) : p][::-1]
            tried[line[p]] = (*before, line[0], *others)
    return tried


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
        fetchers = [h for h in members if needs_files(h.found) and not h.full_verify]
        for h in members:
            if h.full_verify or (needs_sync(h.found) and not needs_files(h.found)):
                parts[h.name] = FanOutPart("hub")  # re-hash everything, or only clean up
            elif not needs_files(h.found):
                parts[h.name] = FanOutPart(None)
        if not fetchers:
            continue
        if port is None:
            parts.update({h.name: FanOutPart("hub") for h in fetchers})
            continue
        ready = [h for h in members if not needs_files(h.found) and not h.full_verify]
        if not ready:
            seed, fetchers = fetchers[0], fetchers[1:]
            ready = [seed]
            parts[seed.name] = FanOutPart("hub")
        tried = chains([Source(h.name, h.address) for h in ready], [Source(h.name, h.address) for h in fetchers])
        served: dict[str, list[str]] = {}
        for fetcher, sources in tried.items():
            parts[fetcher.host] = FanOutPart("peers", sources)
            for s in sources:
                served.setdefault(s.host, []).append(fetcher.address)
        for name, allowed in served.items():
            parts[name] = FanOutPart(parts[name].sync, parts[name].peers, tuple(allowed))
    return parts
