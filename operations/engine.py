"""Engine (and tool) releases: one immutable virtual environment per pinned version."""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator
from typing import Any
from urllib.parse import urlparse

from pyinfra.api.operation import operation
from pyinfra.context import host


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

    A release with a complete marker is never touched again; a folder without one is an
    interrupted install and is rebuilt from scratch.

    **Example:**

    .. code:: python

        engine.venv(path="/opt/kimi/engines/vllm-0.34.0", package="vllm", version="0.34.0",
                    requirements=["vllm==0.34.0"], index_url="https://pypi.org/simple", current=None)
    """
    marker = release_marker(package, version, requirements, index_url)
    if current is not None and {k: current.get(k) for k in ("package", "version", "requirements")} == {
        k: marker[k] for k in ("package", "version", "requirements")
    }:
        host.noop(f"{package} {version} is installed at {path}")
        return
    q = shlex.quote
    pip = [
        f"{q(path)}/bin/pip",
        "install",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--index-url",
        q(index_url),
    ]
    parsed = urlparse(index_url)
    if parsed.scheme == "http" and parsed.hostname:
        pip += ["--trusted-host", q(parsed.hostname)]
    pip += [q(r) for r in requirements]
    marker_json = json.dumps(marker, sort_keys=True)
    yield " && ".join([
        f"rm -rf {q(path)}",
        f"mkdir -p {q(path.rsplit('/', 1)[0])}",
        f"python3 -m venv {q(path)}",
        " ".join(pip),
        f"{q(path)}/bin/pip freeze --all > {q(path)}/.kimi-freeze.txt",
        # The marker is written last: its presence means the release installed completely.
        f"printf '%s\\n' {q(marker_json)} > {q(path)}/.kimi-release.json.tmp",
        f"mv {q(path)}/.kimi-release.json.tmp {q(path)}/.kimi-release.json",
    ])  # fmt: skip
