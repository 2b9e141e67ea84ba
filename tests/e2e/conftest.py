"""The demo cluster for end-to-end tests: started (or found running) once per module that asks."""

from __future__ import annotations

import pytest

from tests.e2e.demo import cluster


@pytest.fixture(scope="module")
def demo_cluster() -> None:
    """`kimi-deploy cluster up`: starts the demo cluster, or finds it running and changes nothing."""
    cluster("up")
