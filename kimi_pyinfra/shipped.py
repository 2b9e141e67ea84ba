"""Where the files kimi-deploy ships live: a checkout's deploys/, recipes/ and inventories/, or
the same folders inside the installed package (``kimi_pyinfra/deploys`` and so on)."""

from __future__ import annotations

from pathlib import Path

from pyinfra_cli.util import exec_file

_HERE = Path(__file__).resolve().parent
# The folders of a checkout, shipped in the package (pyproject.toml's package-dir)
SHIPPED = ("deploys", "recipes", "inventories")


def shipped(folder: str) -> Path:
    """``folder`` (one of ``SHIPPED``) as installed, else the checkout's."""
    assert folder in SHIPPED, folder
    inside = _HERE / folder
    return inside if inside.is_dir() else _HERE.parent / folder


def deploy_file(name: str) -> str:
    """The path of kimi-deploy's own ``deploys/<name>``, for a user's deploy file to include."""
    path = shipped("deploys") / name
    if not path.is_file():
        raise FileNotFoundError(f"kimi-deploy ships no deploys/{name}")
    return str(path)


def run_deploy(name: str) -> None:
    """Run kimi-deploy's own ``deploys/<name>`` within the deploy file pyinfra is running (a
    user's ``deploys/<name>`` from ``kimi-deploy init``): its operations read as from a checkout."""
    exec_file(deploy_file(name))
