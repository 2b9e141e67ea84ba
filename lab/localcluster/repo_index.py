"""apt repository indexes: ``Packages`` from .deb files and the ``Release`` file that lists them.

The formats are Debian's (https://wiki.debian.org/DebianRepository/Format): a ``Packages`` stanza
is the package's control file plus ``Filename`` (relative to the repository's base URL), ``Size``
and hashes ("Binary Packages Indices"); ``Release`` lists every index file with its size and
MD5Sum/SHA1/SHA256/SHA512 hashes, named relative to the directory ``Release`` lies in ("Release
files"). Both the NVIDIA stand-in repository (flat) and the Debian mirror (``dists/``) use them.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

from localcluster import run
from localcluster.nvidia_debs import SOURCE_DATE_EPOCH
from localcluster.repo_signing import sign

HASHES = (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"), ("SHA512", "sha512"))


def dpkg_architecture() -> str:
    """The controller's (and so the hosts') Debian architecture: ``amd64``, ``arm64``."""
    return run(["dpkg", "--print-architecture"]).stdout.strip()


def digests(data: bytes) -> dict[str, str]:
    """Release field name (``MD5Sum``, ``SHA1``, ...) -> hex digest of ``data``."""
    return {field: hashlib.new(algorithm, data).hexdigest() for field, algorithm in HASHES}


def packages_index(debs: Sequence[Path], filename: Callable[[Path], str]) -> str:
    """The ``Packages`` index of ``debs``: control stanza, ``filename(deb)`` as ``Filename``, size and hashes."""
    stanzas = []
    for deb in sorted(debs, key=lambda p: p.name):
        control = run(["dpkg-deb", "--field", str(deb)]).stdout.rstrip("\n")
        data = deb.read_bytes()
        sums = digests(data)
        extra = [f"Filename: {filename(deb)}", f"Size: {len(data)}"]
        # Packages spells the first one "MD5sum" where Release says "MD5Sum".
        extra += [f"{field.replace('MD5Sum', 'MD5sum')}: {sums[field]}" for field, _ in HASHES]
        stanzas.append(control + "\n" + "\n".join(extra) + "\n")
    return "\n".join(stanzas)


def write_packages(directory: Path, debs: Sequence[Path], filename: Callable[[Path], str]) -> dict[str, bytes]:
    """Write ``Packages`` and ``Packages.gz`` of ``debs`` into ``directory``; return name -> content."""
    packages = packages_index(debs, filename).encode()
    indexes = {"Packages": packages, "Packages.gz": gzip.compress(packages, compresslevel=9, mtime=0)}
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in indexes.items():
        (directory / name).write_bytes(data)
    return indexes


def release(fields: Sequence[tuple[str, str]], indexes: dict[str, bytes]) -> str:
    """A ``Release`` file: ``fields``, a fixed ``Date`` (rebuilds give the same bytes), hashes of ``indexes``."""
    lines = [f"{name}: {value}" for name, value in fields]
    lines.append(f"Date: {email.utils.formatdate(SOURCE_DATE_EPOCH, usegmt=True)}")
    for field, _ in HASHES:
        lines.append(f"{field}:")
        for name, data in sorted(indexes.items()):
            lines.append(f" {digests(data)[field]} {len(data):>8} {name}")
    return "\n".join(lines) + "\n"


def write_release(
    directory: Path, fields: Sequence[tuple[str, str]], indexes: dict[str, bytes], home: Path, fingerprint: str
) -> Path:
    """Write ``directory/Release`` and sign it (``InRelease``, ``Release.gpg``) with the key in ``home``."""
    release_file = directory / "Release"
    release_file.write_text(release(fields, indexes), encoding="utf-8")
    sign(home, fingerprint, release_file)
    return release_file
