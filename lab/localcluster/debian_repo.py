"""The cluster's Debian mirror: the real Debian packages of ``DEBIAN_PACKAGES``, laid out, indexed and
signed like a Debian archive, so that ``apt-get install nginx`` on a host without internet works as
it does against deb.debian.org.

``build(root, cache_dir)`` writes it under the ``apt`` service's ``root/public/debian`` (URL
``http://GATEWAY:8767/debian``), in the layout of https://wiki.debian.org/DebianRepository/Format::

    dists/bookworm/InRelease  Release  Release.gpg
    dists/bookworm/main/binary-amd64/Packages  Packages.gz
    pool/main/n/nginx/nginx_*_amd64.deb  nginx-common_*_all.deb
    pool/main/libn/libnginx-mod-js/libnginx-mod-http-js_*_amd64.deb

- ``pool/<component>/<prefix>/<source>/``: the archive's pool, by source package; the prefix is the
  source's first letter, or its first four for ``lib*`` ("Packages Indices" names each file by its
  path from the archive root in ``Filename``, so any layout works as long as that matches).
- ``Packages``: one stanza per .deb, its control fields (``dpkg-deb --field``) plus ``Filename``,
  ``Size``, ``MD5sum``, ``SHA1``, ``SHA256``, ``SHA512`` ("Binary Packages Indices"); ``Architecture:
  all`` packages are listed in each architecture's index, as Debian's are ("Architectures").
- ``Release``: ``Origin``/``Label: Debian``, ``Suite``/``Codename: bookworm``, ``Architectures``,
  ``Components: main``, ``Date``, and the hashes of both index files by their path from
  ``dists/bookworm`` ("Release files"), signed (``InRelease``, ``Release.gpg``) with the cluster's
  signing key (``localcluster.repo_signing``), which hosts trust through ``localcluster.debian_sources``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from localcluster import debian_debs, run
from localcluster.debian_sources import COMPONENT, URL_PATH
from localcluster.image import SUITE
from localcluster.repo_index import dpkg_architecture, write_packages, write_release
from localcluster.repo_signing import ensure_key, signing_home

ORIGIN = LABEL = "Debian"


def repo_dir(root: Path) -> Path:
    """Where the mirror lies in the ``apt`` service's ``root``."""
    return root / "public" / URL_PATH.strip("/")


def pool_path(deb: Path) -> str:
    """``pool/main/<prefix>/<source>/<file>``: where Debian's archive keeps ``deb``."""
    source = run(["dpkg-deb", "--field", str(deb), "Source"]).stdout.split()
    name = source[0] if source else run(["dpkg-deb", "--field", str(deb), "Package"]).stdout.strip()
    prefix = name[:4] if name.startswith("lib") else name[:1]
    return f"pool/{COMPONENT}/{prefix}/{name}/{deb.name}"


def _place(deb: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(deb, target)  # no second copy of the cache on one disk
    except OSError:
        shutil.copy2(deb, target)
    return target


def build(root: Path, cache_dir: Path) -> Path:
    """Build the signed mirror under ``root/public`` from the debs cached in ``cache_dir``; return its directory.

    The debs are downloaded once (``localcluster.debian_debs``); the mirror is made anew each time.
    """
    home = signing_home(root)
    fingerprint = ensure_key(home)
    architecture = dpkg_architecture()
    target = repo_dir(root)
    staging = target.with_name(f".{target.name}.building")
    if staging.exists():
        shutil.rmtree(staging)
    debs = [_place(deb, staging / pool_path(deb)) for deb in debian_debs.ensure(cache_dir)]
    binary = f"{COMPONENT}/binary-{architecture}"
    dist = staging / "dists" / SUITE
    indexes = write_packages(dist / binary, debs, lambda deb: deb.relative_to(staging).as_posix())
    fields = (
        ("Origin", ORIGIN),
        ("Label", LABEL),
        ("Suite", SUITE),
        ("Codename", SUITE),
        ("Architectures", architecture),
        ("Components", COMPONENT),
        ("Description", f"kimi-cluster mirror of Debian {SUITE}: the packages the deploy installs"),
    )
    write_release(dist, fields, {f"{binary}/{name}": data for name, data in indexes.items()}, home, fingerprint)
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target
