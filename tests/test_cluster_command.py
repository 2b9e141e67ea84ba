"""``kimi-deploy cluster`` is the lab's (lab/pyproject.toml): where the lab is not installed (the
product's wheel alone), the command says in one line how to get it, and exits 2."""

from __future__ import annotations

import sys

import pytest

from kimi_pyinfra.cli import main


def test_without_the_lab_the_cluster_command_names_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "localcluster", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "localcluster.cli", raising=False)
    assert main(["cluster", "status"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "kimi-deploy: cluster: the local test cluster is not installed: from a checkout, "
        "run scripts/demo (or pip install -e ./lab)"
    ]
