"""A feature whose extra is not installed says which extra in one line (the default install holds
only what a converge imports: tests/test_controller_constraints.py)."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest

from kimi_deploy.extras import EXTRAS, MissingExtra, need
from kimi_pyinfra.cli import main
from tests.conftest import PROD, RECIPE


@pytest.mark.parametrize(("module", "extra"), [("matplotlib", "plot"), ("crossplane", "ledger")])
def test_a_missing_extra_is_named_in_one_line(module: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what an install without the extra finds
    with pytest.raises(MissingExtra) as missing:
        need(module)
    feature = EXTRAS[module][1]
    assert str(missing.value) == f"{module}: not installed: {feature} needs it: pip install 'kimi-deploy[{extra}]'"


def test_the_ledger_without_its_extra_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "crossplane", None)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["ledger", RECIPE, PROD])
    assert (code, out.getvalue()) == (2, "")
    assert err.getvalue() == (
        "crossplane: not installed: the fidelity ledger needs it: pip install 'kimi-deploy[ledger]'\n"
    )


def test_an_installed_extra_is_the_module() -> None:
    assert need("crossplane").__name__ == "crossplane"
