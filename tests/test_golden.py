"""Golden files: what every topology and role renders, byte for byte.

Regenerate after an intended change with ``KIMI_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and
review the diff: it is exactly what changes on the hosts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.files import render_host
from tests.conftest import RECIPE

GOLDEN = Path(__file__).parent / "golden" / "prod"

# One host per topology, pool and role: single, leader, worker, router.
HOSTS = [
    "b300-01",  # single-node: vLLM TP=8
    "gb300-p01",  # gb300-pd prefill leader (TP=8 over two trays)
    "gb300-p02",  # gb300-pd prefill worker
    "gb300-d01",  # gb300-pd decode leader (DP=16 over four trays)
    "gb300-d02",  # gb300-pd decode worker
    "gb300-rt01",  # gb300-pd router + Mooncake master
    "tpu7x-w0",  # tpu7x sglang-jax leader
    "tpu7x-w1",  # tpu7x sglang-jax worker
    "b300-02",  # TokenSpeed single
    "h200-01",  # TokenSpeed multi-node leader
    "h200-02",  # TokenSpeed multi-node worker
]


def _rendered(recipe: Recipe, prod: Inventory, host: str) -> dict[str, str]:
    spec = plan(recipe, RECIPE, prod).for_host(host)
    return {f.path.lstrip("/"): f.content for f in render_host(recipe, spec)}


@pytest.mark.parametrize("host", HOSTS)
def test_rendered_files_match_golden(recipe: Recipe, prod: Inventory, host: str) -> None:
    files = _rendered(recipe, prod, host)
    base = GOLDEN / host
    if os.environ.get("KIMI_UPDATE_GOLDEN"):
        for rel, content in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(content, encoding="utf-8")
    on_disk = {str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()}
    assert on_disk == set(files), "files a host gets changed: regenerate and review the golden files"
    for rel, content in files.items():
        assert content == (base / rel).read_text(encoding="utf-8"), f"{host}: {rel} differs from golden"


def test_golden_covers_every_topology_and_role(recipe: Recipe, prod: Inventory) -> None:
    full = plan(recipe, RECIPE, prod)
    wanted = {(h.topology, h.pool, h.node_role) for h in full.hosts}
    covered = {(h.topology, h.pool, h.node_role) for h in full.hosts if h.host in HOSTS}
    assert covered == wanted
