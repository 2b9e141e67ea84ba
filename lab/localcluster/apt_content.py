"""What the ``apt`` service serves: the NVIDIA stand-in repository and the Debian mirror, one key for both.

``build(root, url)`` is the service's prepare hook: ``url`` (``http://GATEWAY:8767/compute/cuda/repos``,
what ``state.json`` records) is the NVIDIA repository's (``localcluster.apt_repo``); the Debian mirror
(``localcluster.debian_repo``) is at ``/debian`` beside it and takes its packages from the cluster's cache.
"""

from __future__ import annotations

from pathlib import Path

from localcluster import apt_repo, debian_repo
from localcluster.state import Settings


def build(root: Path, url: str) -> list[Path]:
    """Build both repositories under ``root/public``; return their directories."""
    return [apt_repo.build(root, url), debian_repo.build(root, Settings.from_env().cache_dir)]
