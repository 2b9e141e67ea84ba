"""Who fetches weights from the Hub, who from peers, and who serves them (decided before any change)."""

from __future__ import annotations

from typing import Any

from hostside.probe_types import WeightsFound
from kimi_deploy.weights_fanout import FanOutPart, Source, WeightsHost, plan_fan_out

WANTS = ("moonshotai/Kimi-K3.1-Pro", "a" * 40, "/srv/models/moonshotai--Kimi-K3.1-Pro/" + "a" * 40)
READY: WeightsFound = {"exists": True, "missing": [], "unverified": [], "extra": []}
EMPTY: WeightsFound = {"exists": False, "missing": [], "unverified": [], "extra": []}
DAMAGED: WeightsFound = {
    "exists": True,
    "missing": ["model-00057-of-00096.safetensors"],
    "unverified": [],
    "extra": [],
}


def host(i: int, found: WeightsFound | None, port: int | None = 8479, **kw: Any) -> WeightsHost:
    return WeightsHost(f"h{i}", f"10.0.0.{i}", kw.pop("wants", WANTS), port, found, **kw)


def test_on_a_fresh_cluster_one_host_fetches_from_the_hub_and_serves_all_others() -> None:
    parts = plan_fan_out([host(i, EMPTY) for i in range(1, 5)])
    assert parts["h1"] == FanOutPart("hub", (), ("10.0.0.2", "10.0.0.3", "10.0.0.4"))
    for name in ("h2", "h3", "h4"):
        assert parts[name] == FanOutPart("peers", (Source("h1", "10.0.0.1"),))


def test_hosts_holding_the_files_verified_are_the_sources_and_the_hub_is_not_asked() -> None:
    parts = plan_fan_out([host(1, READY), host(2, DAMAGED), host(3, READY), host(4, EMPTY)])
    assert parts["h1"] == FanOutPart(None, (), ("10.0.0.2", "10.0.0.4"))
    assert parts["h3"] == FanOutPart(None, (), ("10.0.0.2", "10.0.0.4"))
    # Each fetching host starts at another source, so the load spreads.
    assert parts["h2"].sync == "peers"
    assert [p.host for p in parts["h2"].peers] == ["h1", "h3"]
    assert parts["h4"].sync == "peers"
    assert [p.host for p in parts["h4"].peers] == ["h3", "h1"]


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
