"""Preflight gates: each one's exact line, from profiles shaped like real hosts'."""

from __future__ import annotations

import copy

import pytest

from kimi_deploy.host.preflight import Needs, check
from kimi_deploy.host.profile_types import HostProfile
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.plan.servespec import Plan
from kimi_deploy.recipe import HiCache, Recipe
from tests.conftest import RECIPE, sglang_slice
from tests.profiles import profile_of

TB = 10**12
GIB = 2**30


@pytest.fixture(scope="module")
def full(recipe: Recipe, prod: Inventory) -> Plan:
    return plan(recipe, RECIPE, prod)


def _profile(count: int, model: str, memory_mib: int, *, vendor: str = "nvidia") -> HostProfile:
    port = {"port": 1, "state": "ACTIVE", "phys_state": "LinkUp", "rate_gbps": 400, "link_layer": "InfiniBand"}
    return profile_of(
        accelerators={"vendor": vendor, "count": count, "model": model, "memory_mib": memory_mib},
        disk={"path": "/srv/models", "fs_type": "xfs", "free_bytes": 30 * TB, "total_bytes": 30 * TB},
        memory={"total_bytes": 2048 * GIB},
        rdma=[{"device": f"mlx5_{i}", **port} for i in range(4)],
        drivers={"nvidia": "580.95.05", "imex_active": "active"},
    )


B300 = _profile(8, "NVIDIA B300 SXM6 AC", 275040)
GB300 = _profile(4, "NVIDIA GB300", 284208)


def _needs(recipe: Recipe, full: Plan, host: str, missing: int = 1_560_000_000_000) -> Needs:
    spec = full.for_host(host)
    devices = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"] if spec.topology == "gb300-pd" else []
    return Needs(recipe, spec, 1_560_000_000_000, missing, devices)


def test_a_host_that_matches_passes(recipe: Recipe, full: Plan) -> None:
    assert check(_needs(recipe, full, "b300-01"), B300) == []
    assert check(_needs(recipe, full, "gb300-p02"), GB300) == []


@pytest.mark.parametrize(
    ("host", "python", "line"),
    [
        ("b300-01", "3.12.3", None),
        # Ubuntu 22.04's python3: vLLM 0.34.0's wheel requires 3.11 or newer
        ("b300-01", "3.10.12", "b300-01: python3: vllm 0.33.0 installs on Python <3.15,>=3.11, found 3.10.12"),
        ("tpu7x-w0", "3.12.3", None),
        # Debian 12's: sglang-jax has needed 3.12 since 0.0.1.post2
        ("tpu7x-w0", "3.11.2", "tpu7x-w0: python3: sglang-jax 0.1.0rc0 installs on Python <3.14,>=3.12, found 3.11.2"),
        ("gb300-rt01", "3.9.2", None),  # the router host installs no engine
    ],
)
def test_a_host_whose_python_the_engine_release_does_not_install_on_is_named(
    recipe: Recipe, full: Plan, host: str, python: str, line: str | None
) -> None:
    spec = full.for_host(host)
    profile = _profile(4, "TPU7x", 0, vendor="tpu") if spec.accelerator_vendor == "tpu" else copy.deepcopy(B300)
    profile["os"]["python"] = python
    assert [f for f in check(_needs(recipe, full, host), profile) if ": python3: " in f] == ([line] if line else [])


def test_wrong_accelerators(recipe: Recipe, full: Plan) -> None:
    h100 = _profile(4, "NVIDIA H100 80GB HBM3", 81559)
    assert check(_needs(recipe, full, "gb300-d03"), h100) == [
        "gb300-d03: accelerators: pool decode needs 4 x GB300 with >= 260 GiB, found 4 x NVIDIA H100 80GB HBM3 (79 GiB)"
    ]
    assert check(_needs(recipe, full, "b300-01"), GB300)[0].startswith(
        "b300-01: accelerators: pool serve needs 8 x B300 with >= 260 GiB, found 4 x NVIDIA GB300"
    )


def test_b300_is_not_a_gb300(recipe: Recipe, full: Plan) -> None:
    eight_gb300 = _profile(8, "NVIDIA GB300", 284208)
    assert check(_needs(recipe, full, "b300-01"), eight_gb300) == [
        "b300-01: accelerators: pool serve needs 8 x B300 with >= 260 GiB, found 8 x NVIDIA GB300 (277 GiB)"
    ]


def test_driver_error_is_named(recipe: Recipe, full: Plan) -> None:
    broken = copy.deepcopy(B300)
    broken["accelerators"].update({"count": 0, "model": None, "error": "Driver/library version mismatch"})
    (line,) = check(_needs(recipe, full, "b300-01"), broken)
    assert line.endswith("found an error: Driver/library version mismatch")


def test_disk_too_small_now_and_for_a_rollback_copy(recipe: Recipe, full: Plan) -> None:
    small = copy.deepcopy(B300)
    small["disk"].update({"free_bytes": 1 * TB, "total_bytes": 4 * TB})
    assert check(_needs(recipe, full, "b300-01"), small) == [
        "b300-01: disk: /srv/models (xfs) needs 1526 GiB free for the weights, found 931 GiB free"
    ]
    small["disk"].update({"free_bytes": 2 * TB, "total_bytes": 3 * TB})
    assert check(_needs(recipe, full, "b300-01"), small) == [
        "b300-01: disk: /srv/models (xfs) needs 3051 GiB in all (weights and a rollback copy), found 2794 GiB"
    ]
    # Weights already in place need no free space now.
    small["disk"].update({"free_bytes": 0, "total_bytes": 4 * TB})
    assert check(_needs(recipe, full, "b300-01", missing=0), small) == []


def test_hicache_needs_host_ram(recipe: Recipe, prod: Inventory) -> None:
    offloads = sglang_slice(recipe, hicache=HiCache(ratio=2.0))
    host = copy.deepcopy(GB300)
    host["memory"]["total_bytes"] = 1024 * GIB
    assert check(_needs(offloads, plan(offloads, RECIPE, prod, "tpu7x"), "tpu7x-w0"), host) == [
        "tpu7x-w0: host RAM: HiCache ratio 2 needs 1424 GiB (90% of RAM at most), found 1024 GiB"
    ]


def test_kv_over_rdma_needs_active_ports(recipe: Recipe, full: Plan) -> None:
    down = copy.deepcopy(GB300)
    down["rdma"][2]["state"] = "DOWN"
    assert check(_needs(recipe, full, "gb300-d01"), down) == [
        "gb300-d01: RDMA: mlx5_2 needs an ACTIVE port for KV transfer, found DOWN"
    ]
