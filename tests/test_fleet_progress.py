"""The step lines of a converge: pyinfra's per-host informational lines go, anything else stays."""

from __future__ import annotations

import logging

import click
import pytest
from pyinfra.api.config import Config
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State

from kimi_pyinfra.fleet_progress import PerHostLines


@pytest.fixture
def prefix() -> str:
    """A host's prefix as pyinfra prints it, colours included."""
    inventory = Inventory((["kimi-h12"], {}))  # type: ignore[no-untyped-call]
    State(inventory, Config())  # type: ignore[no-untyped-call]
    return inventory.get_host("kimi-h12").print_prefix


def _kept(message: str, level: int = logging.INFO) -> bool:
    return PerHostLines().filter(logging.LogRecord("pyinfra", level, __file__, 1, message, None, None))


@pytest.mark.parametrize(
    "said",
    [
        click.style("No changes", "cyan"),
        click.style("Success", "green"),
        click.style("Success on retry 1", "green"),
        click.style("Skipped", "blue"),
        f"{click.style('Ready:', 'green')} {click.style('deploys/kimi.py', bold=True)}",
        "plan: topology demo-vllm, pool serve, single 0/1, units kimi-vllm",
        "converged, no step to take",
    ],
)
def test_a_hosts_routine_line_goes(prefix: str, said: str) -> None:
    assert not _kept(f"{prefix}{said}")


def test_the_lines_once_per_operation_stay() -> None:
    assert _kept(f"{click.style('--> Starting operation:', 'blue')} {click.style('Releases', bold=True)} ")
    assert _kept("--> Releases (engine, host tools): 3 changed, 61 unchanged, 0 failed of 64 hosts in 12.0 s")


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_what_goes_wrong_is_never_held_back(prefix: str, level: int) -> None:
    assert _kept(f"{prefix}{click.style('No changes', 'cyan')}", level)
    assert _kept(f"{prefix}kimi-deploy: comm check: kimi-h4 -> kimi-h3:29500 (dist_init): timed out", level)


def test_other_host_lines_stay(prefix: str) -> None:
    assert _kept(f"{prefix}kimi-deploy: weights: 96 files from peers (6233480 bytes from kimi-h1)")
    assert _kept(f"{prefix}{click.style('Connected', 'green')}")
