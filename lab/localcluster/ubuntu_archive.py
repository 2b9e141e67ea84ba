"""Ubuntu 24.04 for the hosts that stand for Ubuntu machines: the archive and the key that signs it.

The base image of such a host is made with mmdebstrap from Ubuntu's own archive
(``http://archive.ubuntu.com/ubuntu``, suite ``noble``, components main and universe), the package
registry Ubuntu machines install from, reached with apt's own client. apt checks the archive's
``InRelease`` against Ubuntu's archive key, taken from the ``ubuntu-keyring`` package of that same
archive; the package is trusted by its SHA-256, written here (as noble's ``Packages`` index lists it),
not by where it came from, and cached once checked.
"""

from __future__ import annotations

import hashlib
import tempfile
import urllib.request
from pathlib import Path

from localcluster import run
from localcluster.state import ClusterError

MIRROR = "http://archive.ubuntu.com/ubuntu"
SUITE = "noble"
COMPONENTS = ("main", "universe")
# noble's ubuntu-keyring (dists/noble/main/binary-amd64/Packages: Filename, SHA256).
KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2023.11.28.1_all.deb"
KEYRING_SHA256 = "36de43b15853ccae0028e9a767613770c704833f82586f28eb262f0311adb8a8"
KEYRING_FILE = "usr/share/keyrings/ubuntu-archive-keyring.gpg"
FETCH_TIMEOUT_S = 120


def keyring(cache_dir: Path) -> Path:
    """Ubuntu's archive keyring, from the checked ``ubuntu-keyring`` package (fetched once)."""
    target = cache_dir / f"ubuntu-archive-keyring-{KEYRING_SHA256[:12]}.gpg"
    if target.is_file():
        return target
    url = f"{MIRROR}/{KEYRING_DEB}"
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as answer:  # noqa: S310 - checked by hash below
            data = answer.read()
    except OSError as exc:
        raise ClusterError(f"ubuntu image: cannot fetch {url}: {exc}") from exc
    found = hashlib.sha256(data).hexdigest()
    if found != KEYRING_SHA256:
        raise ClusterError(f"ubuntu image: {url}: expected sha256 {KEYRING_SHA256}, found {found}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kimi-ubuntu-keyring-", dir=cache_dir) as tmp:
        deb = Path(tmp) / "ubuntu-keyring.deb"
        deb.write_bytes(data)
        run(["dpkg-deb", "-x", str(deb), str(Path(tmp) / "x")])
        extracted = Path(tmp) / "x" / KEYRING_FILE
        if not extracted.is_file():
            raise ClusterError(f"ubuntu image: {url} has no /{KEYRING_FILE}")
        partial = target.with_name(f".{target.name}.tmp")
        partial.write_bytes(extracted.read_bytes())
        partial.replace(target)
    return target


def mmdebstrap_options(keyring_file: Path) -> list[str]:
    # Ubuntu gives apt "Priority: important", which the minbase variant leaves out (Debian: required).
    return [f"--components={','.join(COMPONENTS)}", f"--keyring={keyring_file}", "--include=apt"]
