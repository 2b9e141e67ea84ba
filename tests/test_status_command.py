"""``kimi-deploy status INVENTORY [PYINFRA OPTIONS]`` runs the status deploy as ``kimi-deploy converge
INVENTORY --deploy status`` would (the pyinfra installed beside kimi-deploy, pyinfra's options passed
on), with pyinfra's own informational lines held back, its warnings and errors still said; ``-v``
keeps them all. The status deploy probes each host once with the converge's own request."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from kimi_deploy.converge.plan import converge_request
from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from kimi_pyinfra.converge_command import PYINFRA_MAIN
from kimi_pyinfra.status_command import PYINFRA_QUIET_MAIN, QUIET, pyinfra_main, status_argv
from tests.conftest import PROD, ROOT
from tests.test_status_table import planned


def test_status_runs_the_status_deploy_with_pyinfras_options() -> None:
    assert status_argv([PROD], ROOT) == [PROD, "deploys/status.py", "-y"]
    assert status_argv([PROD, "--limit", "b300-01", "-v"], ROOT) == [
        PROD,
        "deploys/status.py",
        "--limit",
        "b300-01",
        "-v",
        "-y",
    ]


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ([], "INVENTORY: give the inventory first: kimi-deploy status INVENTORY [options]"),
        (["--limit", "x"], "INVENTORY: give the inventory first: kimi-deploy status INVENTORY [options]"),
        ([PROD, "--deploy", "kimi"], "--deploy: status runs deploys/status.py;"),
        (["inventories/nope.py"], "inventories/nope.py: no such inventory file"),
    ],
)
def test_what_status_cannot_run_is_one_line(words: list[str], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        status_argv(words, ROOT)
    assert str(refused.value).startswith(said)


def test_pyinfra_runs_quiet_unless_asked_for_its_lines() -> None:
    assert pyinfra_main([PROD, "deploys/status.py", "-y"]) == PYINFRA_QUIET_MAIN
    assert PYINFRA_QUIET_MAIN.endswith(PYINFRA_MAIN)
    for loud in ("-v", "-vvv", "--debug", "--debug-facts"):
        assert pyinfra_main([PROD, "deploys/status.py", loud, "-y"]) == PYINFRA_MAIN


def test_the_quiet_filter_keeps_pyinfras_warnings_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("pyinfra")
    before = list(logger.filters)
    try:
        exec(QUIET, {})
        added = [f for f in logger.filters if f not in before]
        assert len(added) == 1
        kept = [
            level
            for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)
            if logger.filter(logging.LogRecord("pyinfra", level, __file__, 1, "line", None, None))
        ]
        assert kept == [logging.WARNING, logging.ERROR]
    finally:
        for f in [f for f in logger.filters if f not in before]:
            logger.removeFilter(f)


def test_kimi_deploy_status_becomes_pyinfra(monkeypatch: pytest.MonkeyPatch) -> None:
    from kimi_pyinfra import cli  # noqa: PLC0415

    ran: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        ran.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    with pytest.raises(SystemExit):
        cli.main(["status", PROD, "--limit", "b300-01"])
    assert ran == [[sys.executable, "-c", PYINFRA_QUIET_MAIN, PROD, "deploys/status.py", "--limit", "b300-01", "-y"]]


def test_the_status_probe_reads_what_the_converge_reads_and_the_release_records(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kimi_pyinfra.deploys import status  # noqa: PLC0415

    _, todo = planned(recipe, prod, "b300-01")
    monkeypatch.setattr(status, "_planned", lambda h: (None, todo))
    assert status.status_request(Path("b300-01")) == {"request": {**converge_request(todo), "releases": True}}  # type: ignore[arg-type]
