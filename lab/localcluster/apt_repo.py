"""The cluster's NVIDIA apt repository: the stand-in packages, indexed and signed the way NVIDIA's is.

``build(root, url)`` is the ``apt`` service's prepare hook. ``url`` is what ``state.json`` records
for the service, ``http://GATEWAY:8767/compute/cuda/repos``, the local twin of
``https://developer.download.nvidia.com/compute/cuda/repos``; under it, as there, one flat
repository per distribution and architecture::

    <root>/public/compute/cuda/repos/debian12/x86_64/
        cuda-keyring_1.1-1_all.deb  nvidia-*.deb  Packages  Packages.gz
        Release  Release.gpg  InRelease  <key id>.pub
    <root>/public/compute/cuda/repos/debian12/sbsa/      (the other architecture's: arm64 packages)
    <root>/public/compute/cuda/repos/ubuntu2404/x86_64/  (Ubuntu's names: localcluster.nvidia_debs.names)

``Release`` says ``Origin: NVIDIA`` and ``Label: NVIDIA CUDA``, as NVIDIA's does, so that the pin
``cuda-keyring`` installs (``Pin: release l=NVIDIA CUDA``) applies. It is signed (``InRelease``
inline, ``Release.gpg`` detached) with a key made once per cluster in ``<root>/signing`` (a GnuPG
home, never served; see ``localcluster.repo_signing``: the same key signs the Debian mirror) and
shipped inside ``cuda-keyring``; ``<key id>.pub`` is its armored export, like NVIDIA's
``3bf863cc.pub``. A host trusts the repository once it has ``cuda-keyring``::

    curl -fsSLO <url>/debian12/x86_64/cuda-keyring_1.1-1_all.deb && dpkg -i cuda-keyring_1.1-1_all.deb
    apt-get update
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from localcluster import nvidia_debs
from localcluster.image import SUITE
from localcluster.repo_index import dpkg_architecture, write_packages, write_release
from localcluster.repo_signing import ensure_key, public_key, signing_home
from localcluster.state import ClusterError

# ensure_key and public_key too: the cluster's signing key is reached through this module as well.
__all__ = [
    "DISTROS",
    "LABEL",
    "ORIGIN",
    "REPO_ARCHES",
    "UBUNTU_TREE",
    "build",
    "build_tree",
    "deb_architecture",
    "distro",
    "ensure_key",
    "public_key",
    "repo_dir",
]

# NVIDIA's names for a distribution release and an architecture in its repository paths: the
# Debian hosts' tree first, then the tree of the hosts standing for Ubuntu 24.04 machines.
DISTROS = {"bookworm": "debian12"}
UBUNTU_TREE = "ubuntu2404"
REPO_ARCHES = {"amd64": "x86_64", "arm64": "sbsa"}
ORIGIN, LABEL = "NVIDIA", "NVIDIA CUDA"


def distro() -> str:
    """The hosts' distribution as NVIDIA's repository paths name it (``debian12``)."""
    return DISTROS[SUITE]


def deb_architecture() -> str:
    """The controller's (and so the hosts') Debian architecture: ``amd64``, ``arm64``."""
    arch = dpkg_architecture()
    if arch not in REPO_ARCHES:
        raise ClusterError(f"controller: architecture {arch!r} has no NVIDIA repository (known: {sorted(REPO_ARCHES)})")
    return arch


def repo_dir(root: Path, url: str, architecture: str, tree: str | None = None) -> Path:
    """Where the repository of ``tree`` (default: the Debian hosts') served under ``url`` lies in
    the service's ``root``."""
    return root / "public" / urlsplit(url).path.strip("/") / (tree or distro()) / REPO_ARCHES[architecture]


def build(root: Path, url: str) -> Path:
    """Build the signed repositories under ``root/public`` for hosts reaching them at ``url`` (the
    Debian hosts' tree and Ubuntu's); return the Debian hosts' directory.

    The signing key is kept across builds (and across ``down``), everything else is made anew.
    """
    first = build_tree(root, url, distro())
    build_tree(root, url, UBUNTU_TREE)
    # The other architecture's tree too (sbsa beside x86_64), as NVIDIA serves both: what a probe
    # reporting it would be pointed at, though no host here runs its packages.
    for other in sorted(set(REPO_ARCHES) - {deb_architecture()}):
        build_tree(root, url, distro(), other)
    return first


def build_tree(root: Path, url: str, tree: str, architecture: str | None = None) -> Path:
    """Build the signed repository of NVIDIA's tree ``tree`` (``debian12``) for ``architecture``
    (Debian's name; default: the controller's) under ``root/public``."""
    home = signing_home(root)
    fingerprint = ensure_key(home)
    architecture = architecture or deb_architecture()
    target = repo_dir(root, url, architecture, tree)
    staging = target.with_name(f".{target.name}.building")
    repo = nvidia_debs.Repository(
        url=f"{url.rstrip('/')}/{tree}/{REPO_ARCHES[architecture]}/",
        distro=tree,
        architecture=architecture,
        arch_dir=REPO_ARCHES[architecture],
        public_key=public_key(home, fingerprint),
    )
    debs = nvidia_debs.build_all(staging, repo)
    indexes = write_packages(staging, debs, lambda deb: f"./{deb.name}")
    fields = (("Origin", ORIGIN), ("Label", LABEL), ("Architecture", architecture))
    write_release(staging, fields, indexes, home, fingerprint)
    (staging / f"{fingerprint[-8:].lower()}.pub").write_bytes(public_key(home, fingerprint, armor=True))
    for path in staging.iterdir():
        path.chmod(0o644)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target
