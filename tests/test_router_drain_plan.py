"""Which engines a converge drains from their router around each batch, and puts back
(``kimi_deploy.serving.router_drain``): the demo recipe's vLLM topology behind vllm-router, two
instances and a router host. The drain itself is held to the real vllm-router in
``tests/localcluster/test_standins.py``; the whole of it to real engines in
``tests/e2e/test_demo_real.py``."""

from __future__ import annotations

from typing import Any

import yaml

from kimi_deploy.inventory import Inventory, make_host
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.recipe_file import recipe_from
from kimi_deploy.serving.router_drain import drain_api, drain_request, readmit_request
from tests.conftest import ROOT

HOSTS = {"kimi-h1": "10.0.7.1", "kimi-h2": "10.0.7.2", "kimi-h3": "10.0.7.3"}
URLS = ["http://10.0.7.1:8000", "http://10.0.7.2:8000"]


def _routed(**router: Any) -> tuple[Recipe, list[HostPlan]]:
    data = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text(encoding="utf-8"))
    vllm = data["topologies"]["demo-vllm"]
    vllm["group"] = "demo_routed"
    vllm["router"] = {"group": "demo_router", "package": "vllm-router", **router}
    data["topologies"] = {"demo-vllm": vllm}
    recipe = recipe_from(data)
    routed = ("demo_vllm", "demo_routed")
    groups = {"kimi-h1": routed, "kimi-h2": routed, "kimi-h3": ("demo_routed", "demo_router")}
    hosts = tuple(make_host("inv.py", n, groups[n], {"kimi_address": a}) for n, a in HOSTS.items())
    whole = plan(recipe, "recipe.yaml", Inventory("inv.py", hosts, {}))
    return recipe, list(whole.topology("demo-vllm"))


def _router(topology: list[HostPlan]) -> HostPlan:
    return next(h for h in topology if h.role == "router")


def test_each_batch_drains_the_instances_it_restarts_from_the_running_router() -> None:
    recipe, topology = _routed()
    router = _router(topology)
    every = set(HOSTS)
    first = drain_request(recipe, router, topology, 0, restarting=every, running=True)
    second = drain_request(recipe, router, topology, 1, restarting=every, running=True)
    assert first == {
        "router": "vllm-router",
        "api": "http://127.0.0.1:8009",
        "phase": "out",
        "workers": URLS[:1],
        "timeout_s": 120,
    }
    assert second is not None
    assert second["workers"] == URLS[1:]
    # the routers' own batch drains nothing; nor a batch whose instances do not restart
    assert drain_request(recipe, router, topology, 2, restarting=every, running=True) is None
    assert drain_request(recipe, router, topology, 0, restarting={"kimi-h2"}, running=True) is None
    # instance 1 does not serve: it goes first, and the drain with it
    down = drain_request(recipe, router, topology, 0, restarting=every, running=True, down={("serve", 1)})
    assert down is not None
    assert down["workers"] == URLS[1:]
    # an engine host drains nothing itself
    engine = next(h for h in topology if h.host == "kimi-h1")
    assert drain_request(recipe, engine, topology, 0, restarting=every, running=True) is None


def test_no_drain_without_a_running_router_or_with_drain_s_0() -> None:
    recipe, topology = _routed()
    assert drain_request(recipe, _router(topology), topology, 0, restarting=set(HOSTS), running=False) is None
    recipe, topology = _routed(drain_s=0)
    assert drain_api(recipe, _router(topology), topology) is None
    assert drain_request(recipe, _router(topology), topology, 0, restarting=set(HOSTS), running=True) is None


def test_sglang_router_is_not_drained() -> None:
    recipe, topology = _routed()
    topo = recipe.topologies["demo-vllm"]
    assert topo.router is not None
    router = topo.router.model_copy(update={"package": "sglang-router"})
    sglang = recipe.model_copy(update={"topologies": {"demo-vllm": topo.model_copy(update={"router": router})}})
    assert drain_api(sglang, _router(topology), topology) is None


def test_the_engines_a_stopped_drain_left_out_are_put_back_before_the_batches() -> None:
    recipe, topology = _routed()
    router = _router(topology)
    assert readmit_request(recipe, router, topology, []) is None
    assert readmit_request(recipe, router, topology, ["http://10.0.7.9:8000"]) is None  # none of its engines
    back = readmit_request(recipe, router, topology, URLS[1:])
    assert back == {
        "router": "vllm-router",
        "api": "http://127.0.0.1:8009",
        "phase": "in",
        "workers": URLS[1:],
        "timeout_s": 120,
    }
    # one that does not serve now comes back after its own batch
    assert readmit_request(recipe, router, topology, URLS[1:], down={("serve", 1)}) is None
