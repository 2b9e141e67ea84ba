"""``kimi-deploy --version``: the installed distribution's version, as pip lists it."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from kimi_deploy import __version__
from kimi_pyinfra.cli import main


def test_the_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"kimi-deploy {version('kimi-deploy')}\n"
    assert __version__ == version("kimi-deploy")
