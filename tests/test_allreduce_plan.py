"""Who runs the all-reduce check with whom: one group per engine instance, ranks by backend."""

from __future__ import annotations

from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import AllReduce, Recipe
from kimi_deploy.serving.allreduce import all_reduce_request, members, why_not
from kimi_deploy.serving.commcheck import check_request


def _with(recipe: Recipe, topology: str, check: AllReduce | None) -> Recipe:
    topo = recipe.topologies[topology]
    changed = topo.model_copy(update={"comm_check": topo.comm_check.model_copy(update={"all_reduce": check})})
    return recipe.model_copy(update={"topologies": {**recipe.topologies, topology: changed}})


def test_one_host_instance_reduces_over_its_eight_gpus_with_nccl(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    hosts = full.topology("single-node")
    request = all_reduce_request(recipe, hosts[0], hosts, "run1")
    assert request is not None
    assert request["backend"] == "nccl"
    assert request["hosts"] == [{"host": "b300-01", "address": "10.21.0.11", "ranks": 8}]
    assert request["rendezvous"] == {"address": "10.21.0.11", "port": 29498}
    assert request["min_busbw_gbs"] == 370
    # The engine's environment: its NCCL settings hold for the check too.
    engine = next(u for u in hosts[0].units if u.kind == "engine")
    assert request["env"] == dict(engine.env)
    assert request["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"


def test_a_two_host_instance_has_sixteen_ranks_and_its_rendezvous_on_the_leader(
    recipe: Recipe, prod: Inventory
) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    hosts = full.topology("tokenspeed-multi")
    leader, worker = (all_reduce_request(recipe, h, hosts, "run1") for h in hosts)
    assert leader is not None
    assert worker is not None
    assert [(h["host"], h["ranks"]) for h in worker["hosts"]] == [("h200-01", 8), ("h200-02", 8)]
    assert worker["rendezvous"] == {"address": "10.31.0.11", "port": 29498}
    # NCCL goes where the engines' will: the hosts' bootstrap interface and HCAs from host data.
    assert worker["env"]["NCCL_SOCKET_IFNAME"] == worker["env"]["GLOO_SOCKET_IFNAME"] == "ens1f0"
    assert worker["env"]["NCCL_IB_HCA"] == ",".join(f"mlx5_{i}" for i in range(8))
    assert {k: v for k, v in leader.items() if k not in ("me", "address")} == {
        k: v for k, v in worker.items() if k not in ("me", "address")
    }
    # The communication check, run first, makes sure the worker reaches the rendezvous port.
    ports = check_request(recipe, hosts[1], hosts, "run1")["peers"][0]["ports"]
    assert {"port": 29498, "label": "all-reduce rendezvous"} in ports
    assert all(p["port"] != 29498 for p in check_request(recipe, hosts[0], hosts, "run1")["peers"][0]["ports"])


def test_each_prefill_and_decode_instance_reduces_alone_and_the_router_not_at_all(
    recipe: Recipe, prod: Inventory
) -> None:
    changed = _with(recipe, "gb300-pd", AllReduce(min_busbw_gbs=300))
    full = plan(changed, "recipes/kimi-k3.1-pro.yaml", prod)
    hosts = full.topology("gb300-pd")
    groups = {h.host: [m.host for m in members(h, hosts)] for h in hosts}
    assert groups["gb300-p03"] == groups["gb300-p04"] == ["gb300-p03", "gb300-p04"]
    assert groups["gb300-d03"] == ["gb300-d01", "gb300-d02", "gb300-d03", "gb300-d04"]
    router = full.for_host("gb300-rt01")
    assert groups["gb300-rt01"] == []
    assert all_reduce_request(changed, router, hosts, "run1") is None
    assert why_not(changed, router, hosts) == "gb300-rt01 runs no engine of topology gb300-pd"
    decode = all_reduce_request(changed, full.for_host("gb300-d02"), hosts, "run1")
    assert decode is not None
    assert sum(h["ranks"] for h in decode["hosts"]) == 16


def test_gloo_takes_one_rank_a_host_so_a_one_host_instance_has_nothing_to_reduce(
    recipe: Recipe, prod: Inventory
) -> None:
    changed = _with(recipe, "single-node", AllReduce(min_busbw_gbs=1, backend="gloo"))
    full = plan(changed, "recipes/kimi-k3.1-pro.yaml", prod)
    host = full.topology("single-node")[0]
    assert all_reduce_request(changed, host, [host], "run1") is None
    assert (
        why_not(changed, host, [host])
        == "instance single-node/serve#0 has a single gloo rank: nothing to reduce across"
    )
    multi = _with(recipe, "tokenspeed-multi", AllReduce(min_busbw_gbs=1, backend="gloo"))
    hosts = plan(multi, "recipes/kimi-k3.1-pro.yaml", prod).topology("tokenspeed-multi")
    request = all_reduce_request(multi, hosts[0], hosts, "run1")
    assert request is not None
    assert [h["ranks"] for h in request["hosts"]] == [1, 1]


def test_a_topology_without_the_check_says_so(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    host = full.for_host("gb300-p01")
    assert why_not(recipe, host, full.topology("gb300-pd")) == "topology gb300-pd sets no comm_check.all_reduce"
