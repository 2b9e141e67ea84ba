"""The tests' demo cluster for end-to-end tests (``tests.e2e.demo.STATE_DIR``, a cluster of their
own): started (or found running) once per module that asks, and taken down at the end of the
session that started it (a pytest running beside it, on clusters of its own, leaves it alone)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.demo import UP, cluster


@pytest.fixture(scope="module")
def demo_cluster() -> None:
    """`kimi-deploy cluster up`: starts the tests' cluster, or finds it running and changes nothing."""
    cluster("up")


@pytest.fixture(scope="session", autouse=True)
def _down_at_the_end() -> Iterator[None]:
    yield
    if UP:
        cluster("down")
