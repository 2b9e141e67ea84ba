"""Restart batches: half of a pool's independent instances keep serving while the other half restarts."""

from __future__ import annotations

from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.start_batches import batch_of, first_batch_of, only_instance, restart_line, unit_batch
from kimi_deploy.recipe import Recipe


def test_instances_alternate_and_a_spanning_instance_moves_as_one(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    pd = full.topology("gb300-pd")
    batches = {h.host: batch_of(h, pd) for h in pd}
    # Three prefill instances of two hosts each: instances 0 and 2 first, instance 1 after.
    assert [batches[f"gb300-p0{i}"] for i in range(1, 7)] == [0, 0, 1, 1, 0, 0]
    # The one decode instance has nothing to keep serving; the router comes once all engines run.
    assert {batches[f"gb300-d0{i}"] for i in range(1, 5)} == {0}
    assert batches["gb300-rt01"] == 2


def test_a_single_instance_pool_is_one_batch(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    tpu = full.topology("tpu7x")
    assert {batch_of(h, tpu) for h in tpu} == {0}


def test_the_mooncake_master_starts_before_the_engines_that_connect_to_it(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    pd = full.topology("gb300-pd")
    router = full.for_host("gb300-rt01")
    batch = batch_of(router, pd)
    assert {u.name: unit_batch(u.stage, batch) for u in router.units} == {
        "kimi-mooncake-master": 0,
        "kimi-router": 2,
        "kimi-gateway": 2,
    }
    # Its host's new release is in place from the first batch on; every engine host's in its own.
    assert first_batch_of(router, pd) == 0
    assert all(first_batch_of(h, pd) == batch_of(h, pd) for h in pd if h.role != "router")


def test_the_plan_says_which_pools_keep_serving_and_which_restart_their_only_instance(
    recipe: Recipe, prod: Inventory
) -> None:
    full = plan(recipe, "recipes/kimi-k3.1-pro.yaml", prod)
    pd = full.topology("gb300-pd")
    assert restart_line(pd) == (
        "restarts: pool prefill: 3 instances in two batches, the second once the first answers; "
        "pool decode: the only instance, without service until it answers again"
    )
    assert {h.host: only_instance(h, pd) for h in pd if h.host in ("gb300-p01", "gb300-d02", "gb300-rt01")} == {
        "gb300-p01": None,
        "gb300-d02": "gb300-pd/decode",
        "gb300-rt01": None,
    }
