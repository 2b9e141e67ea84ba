"""Where the example files kimi-deploy ships live: a checkout's recipes/ and inventories/, or the
same folders inside the installed package (``kimi_pyinfra/recipes`` and so on). The deploys are
the package's own modules (``kimi_pyinfra.deploys``)."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The folders of a checkout, shipped in the package (pyproject.toml's package-dir)
SHIPPED = ("recipes", "inventories")


def shipped(folder: str) -> Path:
    """``folder`` (one of ``SHIPPED``) as installed, else the checkout's."""
    assert folder in SHIPPED, folder
    inside = _HERE / folder
    return inside if inside.is_dir() else _HERE.parent / folder
