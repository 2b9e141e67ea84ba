"""A run widens pyinfra's pools to every host: an operation whose hosts wait on one another (the
weights chain) must not leave some of them waiting for a slot."""

from __future__ import annotations

import os
import sys

import pytest
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from kimi_pyinfra.all_at_once import widen_pools


def _state(hosts: int) -> State:
    return State(Inventory(([f"h{i}" for i in range(hosts)], {})), Config())  # type: ignore[no-untyped-call]


def _beyond_the_default() -> int:
    return (os.cpu_count() or 1) * 20 + 5  # pyinfra's default: 20 per CPU


def test_pyinfras_default_pool_is_widened_to_every_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["pyinfra", "inventory.py", "deploy.py"])
    monkeypatch.delenv("PYINFRA_PARALLEL", raising=False)
    hosts = _beyond_the_default()
    state = _state(hosts)
    assert state.pool.size < hosts  # what pyinfra gives by itself
    assert widen_pools(state) == hosts
    assert (state.pool.size, state.fact_pool.size, state.config.PARALLEL) == (hosts, hosts, hosts)
    assert widen_pools(state) is None  # once is enough


def test_an_operators_parallel_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["pyinfra", "--parallel", "8", "inventory.py", "deploy.py"])
    state = _state(_beyond_the_default())
    size = state.pool.size
    assert widen_pools(state) is None
    assert state.pool.size == size
