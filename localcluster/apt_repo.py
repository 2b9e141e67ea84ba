"""The cluster's NVIDIA apt repository: the stand-in packages, indexed and signed the way NVIDIA's is.

``build(root, url)`` is the ``apt`` service's prepare hook. ``url`` is what ``state.json`` records
for the service, ``http://GATEWAY:8767/compute/cuda/repos``, the local twin of
``https://developer.download.nvidia.com/compute/cuda/repos``; under it, as there, one flat
repository per distribution and architecture::

    <root>/public/compute/cuda/repos/debian12/x86_64/
        cuda-keyring_1.1-1_all.deb  nvidia-*.deb  Packages  Packages.gz
        Release  Release.gpg  InRelease  <key id>.pub

``Release`` says ``Origin: NVIDIA`` and ``Label: NVIDIA CUDA``, as NVIDIA's does, so that the pin
``cuda-keyring`` installs (``Pin: release l=NVIDIA CUDA``) applies. It is signed (``InRelease``
inline, ``Release.gpg`` detached) with a key made once per cluster in ``<root>/signing`` (a GnuPG
home, never served) and shipped inside ``cuda-keyring``; ``<key id>.pub`` is its armored export,
like NVIDIA's ``3bf863cc.pub``. A host trusts the repository once it has ``cuda-keyring``::

    curl -fsSLO <url>/debian12/x86_64/cuda-keyring_1.1-1_all.deb && dpkg -i cuda-keyring_1.1-1_all.deb
    apt-get update
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from localcluster import nvidia_debs, run
from localcluster.image import SUITE
from localcluster.state import ClusterError

# NVIDIA's names for a distribution release and an architecture in its repository paths.
DISTROS = {"bookworm": "debian12"}
REPO_ARCHES = {"amd64": "x86_64", "arm64": "sbsa"}
KEY_UID = "kimi-deploy local cluster CUDA repository <kimi-cluster@localhost>"
ORIGIN, LABEL = "NVIDIA", "NVIDIA CUDA"
HASHES = (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"), ("SHA512", "sha512"))


def distro() -> str:
    """The hosts' distribution as NVIDIA's repository paths name it (``debian12``)."""
    return DISTROS[SUITE]


def deb_architecture() -> str:
    """The controller's (and so the hosts') Debian architecture: ``amd64``, ``arm64``."""
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    if arch not in REPO_ARCHES:
        raise ClusterError(f"controller: architecture {arch!r} has no NVIDIA repository (known: {sorted(REPO_ARCHES)})")
    return arch


def repo_dir(root: Path, url: str, architecture: str) -> Path:
    """Where the repository served under ``url`` lies in the service's ``root``."""
    return root / "public" / urlsplit(url).path.strip("/") / distro() / REPO_ARCHES[architecture]


def _gpg(home: Path, *args: str) -> str:
    argv = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", ""]
    return run([*argv, *args]).stdout


def _stop_agent(home: Path) -> None:
    # Signing starts a gpg-agent for this home; nothing of the build may outlive it.
    run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)


def _secret_fingerprint(home: Path) -> str | None:
    if not home.is_dir():
        return None
    listing = _gpg(home, "--with-colons", "--list-secret-keys")
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    return fingerprints[0] if fingerprints else None


def ensure_key(home: Path) -> str:
    """The fingerprint of the repository's signing key in GnuPG home ``home``, made on first use."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    try:
        found = _secret_fingerprint(home)
        if found is not None:
            return found
        _gpg(home, "--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
        made = _secret_fingerprint(home)
    finally:
        _stop_agent(home)
    if made is None:
        raise ClusterError(f"{home}: gpg made no signing key")
    return made


def public_key(home: Path, fingerprint: str, armor: bool = False) -> bytes:
    """The signing key's public part: a binary keyring (as apt's ``signed-by`` takes) or armored text."""
    out = home / ("export.asc" if armor else "export.gpg")
    out.unlink(missing_ok=True)
    run(["gpg", "--homedir", str(home), "--batch", "--yes", *(["--armor"] if armor else []),
         "--output", str(out), "--export", fingerprint])  # fmt: skip
    data = out.read_bytes()
    out.unlink()
    if not data:
        raise ClusterError(f"{home}: no public key {fingerprint}")
    return data


def _digests(data: bytes) -> dict[str, str]:
    return {field: hashlib.new(algorithm, data).hexdigest() for field, algorithm in HASHES}


def packages_index(debs: Sequence[Path]) -> str:
    """The ``Packages`` index of a flat repository holding ``debs`` (control stanza, file and hashes)."""
    stanzas = []
    for deb in sorted(debs, key=lambda p: p.name):
        control = run(["dpkg-deb", "--field", str(deb)]).stdout.rstrip("\n")
        data = deb.read_bytes()
        digests = _digests(data)
        extra = [f"Filename: ./{deb.name}", f"Size: {len(data)}"]
        # Packages spells the first one "MD5sum" where Release says "MD5Sum".
        extra += [f"{field.replace('MD5Sum', 'MD5sum')}: {digests[field]}" for field, _ in HASHES]
        stanzas.append(control + "\n" + "\n".join(extra) + "\n")
    return "\n".join(stanzas)


def release(indexes: dict[str, bytes], architecture: str) -> str:
    """The ``Release`` file listing ``indexes`` (name -> bytes) with every hash apt may check."""
    lines = [
        f"Origin: {ORIGIN}",
        f"Label: {LABEL}",
        f"Architecture: {architecture}",
        f"Date: {email.utils.formatdate(nvidia_debs.SOURCE_DATE_EPOCH, usegmt=True)}",
    ]
    for field, _ in HASHES:
        lines.append(f"{field}:")
        for name, data in sorted(indexes.items()):
            lines.append(f" {_digests(data)[field]} {len(data):>8} {name}")
    return "\n".join(lines) + "\n"


def sign(home: Path, fingerprint: str, release_file: Path) -> None:
    """Write ``InRelease`` (clear-signed) and ``Release.gpg`` (detached) next to ``release_file``."""
    where = release_file.parent
    for stale in ("InRelease", "Release.gpg"):
        (where / stale).unlink(missing_ok=True)
    try:
        common = ("--local-user", fingerprint, "--digest-algo", "SHA512")
        _gpg(home, *common, "--clearsign", "--output", str(where / "InRelease"), str(release_file))
        _gpg(home, *common, "--armor", "--detach-sign", "--output", str(where / "Release.gpg"), str(release_file))
    finally:
        _stop_agent(home)


def build(root: Path, url: str) -> Path:
    """Build the signed repository under ``root/public`` for hosts reaching it at ``url``; return its directory.

    The signing key is kept across builds (and across ``down``), everything else is made anew.
    """
    home = root / "signing"
    fingerprint = ensure_key(home)
    architecture = deb_architecture()
    target = repo_dir(root, url, architecture)
    staging = target.with_name(f".{target.name}.building")
    repo = nvidia_debs.Repository(
        url=f"{url.rstrip('/')}/{distro()}/{REPO_ARCHES[architecture]}/",
        distro=distro(),
        architecture=architecture,
        arch_dir=REPO_ARCHES[architecture],
        public_key=public_key(home, fingerprint),
    )
    debs = nvidia_debs.build_all(staging, repo)
    packages = packages_index(debs).encode()
    packages_gz = gzip.compress(packages, compresslevel=9, mtime=0)
    (staging / "Packages").write_bytes(packages)
    (staging / "Packages.gz").write_bytes(packages_gz)
    release_file = staging / "Release"
    release_file.write_text(release({"Packages": packages, "Packages.gz": packages_gz}, architecture))
    sign(home, fingerprint, release_file)
    (staging / f"{fingerprint[-8:].lower()}.pub").write_bytes(public_key(home, fingerprint, armor=True))
    for path in staging.iterdir():
        path.chmod(0o644)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target
