"""Who fetches weights from the Hub, who from peers, and who serves them (decided before any change)."""

from __future__ import annotations

from typing import Any

from kimi_deploy.hostside.probe_types import WeightsFound
from kimi_deploy.weights.fanout import SOURCES, UPSTREAM, FanOutPart, Source, WeightsHost, plan_fan_out

WANTS = ("moonshotai/Kimi-K3.1-Pro", "a" * 40, "/srv/models/moonshotai--Kimi-K3.1-Pro/" + "a" * 40)
READY: WeightsFound = {"exists": True, "missing": [], "unverified": [], "unreadable": [], "extra": []}
EMPTY: WeightsFound = {"exists": False, "missing": [], "unverified": [], "unreadable": [], "extra": []}
DAMAGED: WeightsFound = {
    "exists": True,
    "missing": ["model-00057-of-00096.safetensors"],
    "unverified": [],
    "unreadable": [],
    "extra": [],
}


def host(i: int, found: WeightsFound | None, port: int | None = 8479, **kw: Any) -> WeightsHost:
    return WeightsHost(f"h{i}", f"10.0.0.{i}", kw.pop("wants", WANTS), port, found, **kw)


def _tried(part: FanOutPart) -> list[str]:
    return [p.host for p in part.peers]


def test_on_a_fresh_cluster_one_host_fetches_from_the_hub_and_the_others_form_a_chain() -> None:
    parts = plan_fan_out([host(i, EMPTY) for i in range(1, 5)])
    assert parts["h1"].sync == "hub"
    # Each host fetches from the one before it first (which relays what it receives), then from
    # those before that, then from the chain's source.
    assert [_tried(parts[f"h{i}"]) for i in range(2, 5)] == [["h1"], ["h2", "h1"], ["h3", "h2", "h1"]]
    assert {parts[f"h{i}"].sync for i in range(2, 5)} == {"peers"}
    # Each host answers exactly the hosts that may ask it; the last of the chain serves nobody.
    assert parts["h1"].serves == ("10.0.0.2", "10.0.0.3", "10.0.0.4")
    assert parts["h2"].serves == ("10.0.0.3", "10.0.0.4")
    assert parts["h3"].serves == ("10.0.0.4",)
    assert parts["h4"].serves == ()


def test_at_fleet_size_a_host_tries_a_bounded_list_and_each_link_carries_the_revision_once() -> None:
    parts = plan_fan_out([host(i, EMPTY) for i in range(1, 65)])
    for i in range(2, 65):
        tried = _tried(parts[f"h{i}"])
        assert tried[0] == f"h{i - 1}"
        assert len(tried) <= UPSTREAM + 1 + SOURCES
    # In the plan's first choices every host feeds one other: no star.
    first = [_tried(parts[f"h{i}"])[0] for i in range(2, 65)]
    assert len(set(first)) == len(first)
    # Only the chain's source answers every host (the fallback of last resort); the others a few.
    assert max(len(parts[f"h{i}"].serves) for i in range(2, 65)) <= UPSTREAM


def test_hosts_holding_the_files_verified_are_the_sources_and_each_heads_a_chain() -> None:
    parts = plan_fan_out([host(1, READY), host(2, DAMAGED), host(3, READY), host(4, EMPTY), host(5, EMPTY)])
    assert (parts["h1"].sync, parts["h3"].sync) == (None, None)  # the Hub is not asked
    assert _tried(parts["h2"]) == ["h1", "h3"]
    assert _tried(parts["h4"]) == ["h3", "h1"]
    assert _tried(parts["h5"]) == ["h2", "h1", "h3"]
    assert set(parts["h1"].serves) == {"10.0.0.2", "10.0.0.4", "10.0.0.5"}
    assert set(parts["h3"].serves) == {"10.0.0.2", "10.0.0.4", "10.0.0.5"}
    assert parts["h2"].serves == ("10.0.0.5",)


def test_a_converged_cluster_fetches_nothing_and_serves_nothing() -> None:
    parts = plan_fan_out([host(i, READY) for i in range(1, 5)])
    assert set(parts.values()) == {FanOutPart(None)}


def test_without_fan_out_in_the_recipe_every_host_uses_the_hub() -> None:
    parts = plan_fan_out([host(i, EMPTY, port=None) for i in range(1, 4)] + [host(4, READY, port=None)])
    assert [parts[f"h{i}"] for i in range(1, 5)] == [FanOutPart("hub")] * 3 + [FanOutPart(None)]


def test_a_full_verify_uses_the_hub_and_is_no_source() -> None:
    parts = plan_fan_out([host(1, READY, full_verify=True), host(2, EMPTY)])
    assert parts["h1"] == FanOutPart("hub")
    # With no other source, the fetching host itself goes to the Hub.
    assert parts["h2"] == FanOutPart("hub", (), ())


def test_a_host_with_only_stray_files_cleans_up_and_still_serves() -> None:
    stray: WeightsFound = READY | {"extra": ["extra.bin"]}
    parts = plan_fan_out([host(1, stray), host(2, EMPTY)])
    assert parts["h1"] == FanOutPart("hub", (), ("10.0.0.2",))
    assert parts["h2"] == FanOutPart("peers", (Source("h1", "10.0.0.1"),))


def test_other_revisions_and_hosts_without_weights_are_apart() -> None:
    other = ("moonshotai/Kimi-K3.1-Pro", "b" * 40, "/srv/models/moonshotai--Kimi-K3.1-Pro/" + "b" * 40)
    parts = plan_fan_out([host(1, READY), host(2, EMPTY, wants=other), host(3, None, wants=None)])
    assert parts["h1"] == FanOutPart(None)  # nobody of its revision needs files
    assert parts["h2"] == FanOutPart("hub")  # the first of its revision; none to serve
    assert parts["h3"] == FanOutPart(None)


def test_a_host_whose_probe_failed_is_no_source() -> None:
    parts = plan_fan_out([host(1, None, wants=None), host(2, EMPTY), host(3, EMPTY)])
    assert parts["h2"] == FanOutPart("hub", (), ("10.0.0.3",))
    assert parts["h3"] == FanOutPart("peers", (Source("h2", "10.0.0.2"),))
