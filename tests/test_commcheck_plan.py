"""Which topologies get the communication check, and what each host of them must reach."""

from __future__ import annotations

from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.serving.commcheck import check_request, needs_check, reachable_ports


def test_hosts_that_talk_to_each_other_are_checked_and_independent_ones_are_not(
    recipe: Recipe, prod: Inventory
) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    assert needs_check(full.topology("gb300-pd"))
    assert not needs_check(full.topology("single-node"))


def test_each_host_reaches_every_port_its_peers_listen_on_and_only_those(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    hosts = full.topology("gb300-pd")
    decode_leader = full.for_host("gb300-d01")
    request = check_request(recipe, decode_leader, hosts, "run1")
    assert request["address"] == "10.41.0.31"
    assert request["port"] == recipe.topologies["gb300-pd"].ports.comm_check
    assert [p["host"] for p in request["peers"]] == [h.host for h in hosts if h.host != "gb300-d01"]
    listen = {p["port"] for p in request["listen"]}
    assert {8000, 13345, 5600, 5603} <= listen
    router = next(p for p in request["peers"] if p["host"] == "gb300-rt01")
    assert {p["port"] for p in router["ports"]} == {50051, 8080, 8000}
    worker = next(p for p in request["peers"] if p["host"] == "gb300-d02")
    assert {p["port"] for p in worker["ports"]} == {5604, 5605, 5606, 5607}
    assert request["bandwidth"]["min_mbit_s"] == recipe.topologies["gb300-pd"].comm_check.min_mbit_s


def test_an_api_bound_to_loopback_is_not_for_peers(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    single = full.topology("single-node")[0]
    assert all(p["label"] != "kimi-vllm api" for p in reachable_ports(single))
