"""Engine (and tool) releases: one immutable virtual environment per pinned version."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside_command import hostside_command


def release_marker(package: str, version: str, requirements: list[str], index_url: str) -> dict[str, Any]:
    """What ``.kimi-release.json`` records once a release installed completely."""
    return {"package": package, "version": version, "requirements": requirements, "index_url": index_url}


@operation()
def venv(
    *,
    path: str,
    package: str,
    version: str,
    requirements: list[str],
    index_url: str,
    current: dict[str, Any] | None,
) -> Generator[str, None, None]:
    """
    Install a pinned release into its own virtual environment at ``path``, once.

    + path: the release folder, e.g. ``/opt/kimi/engines/vllm-0.34.0``
    + package: the main package (``vllm``)
    + version: its pinned version
    + requirements: every pinned requirement (``["vllm==0.34.0", "fastsafetensors==0.5.0"]``)
    + index_url: the package index to install from
    + current: the release marker the host probe found in ``path`` (None: absent or incomplete)

    A release with a complete marker is never touched again (one with other pins in its marker is
    an error); a folder without a marker is an interrupted install and is rebuilt from scratch.

    **Example:**

    .. code:: python

        engine.venv(path="/opt/kimi/engines/vllm-0.34.0", package="vllm", version="0.34.0",
                    requirements=["vllm==0.34.0"], index_url="https://pypi.org/simple", current=None)
    """
    marker = release_marker(package, version, requirements, index_url)
    if current is not None:
        if current.get("requirements") == requirements:
            host.noop(f"{package} {version} is installed at {path}")
            return
        # Folders are named by every pin, so this is not ours to rebuild: never change a release.
        raise OperationError(
            f"{path} holds another release ({', '.join(current.get('requirements') or [])}); "
            "an installed release is never changed: remove the folder to rebuild it"
        )
    request = {"path": path, "requirements": requirements, "index_url": index_url, "marker": marker}
    yield hostside_command("python3", "venv_install.py", request)
