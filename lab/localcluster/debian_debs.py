"""Real Debian packages for the cluster's Debian mirror, downloaded once on the controller and cached.

The controller (Debian 12, like the hosts) fetches them with apt's own client, ``apt-get download``
(apt-get(8): it downloads the candidate version's .deb into the current directory), from whatever
mirror its apt is configured for; they are cached in ``<cache>/debian-debs/`` with a stamp written
last, so a second ``cluster up`` downloads nothing. Changing ``DEBIAN_PACKAGES`` fetches them anew.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kimi_deploy.engines.vllm import COMPILER_PACKAGES, CPU_PACKAGES
from kimi_deploy.releases.host_libraries import MOONCAKE_CLIENT, MOONCAKE_MASTER
from kimi_deploy.releases.host_libraries import packages as library_packages
from localcluster import log, run
from localcluster.image import APT_LOCK, SUITE, cache_lock
from localcluster.state import ClusterError

# What the deploy installs on a router host: nginx with its njs (JavaScript) module. Their other
# dependencies (libc6, libcrypt1, libpcre2-8-0, libssl3, zlib1g, iproute2, debconf) are in the hosts'
# base image (localcluster.image): tests/localcluster/test_debian_live.py checks that apt installs these three alone.
NGINX_PACKAGES = ("nginx", "nginx-common", "libnginx-mod-http-js")
# What a host serving vLLM's CPU build gets (libnuma1: it needs only libc6, in the base image), and
# with torch.compile (``cpu.torch_compile``) the C++ compiler inductor builds its kernels with: g++
# and what Debian 12's apt installs with it, without recommends, on the base image (``apt-get
# install --simulate --no-install-recommends -o Dir::State::status=BASE/var/lib/dpkg/status g++
# libpython3-dev``).
CPU_ENGINE_PACKAGES = CPU_PACKAGES
COMPILER_CLOSURE = (
    *COMPILER_PACKAGES,
    "binutils-common", "libbinutils", "libctf-nobfd0", "libctf0", "libgprofng0", "binutils-x86-64-linux-gnu",
    "binutils", "libisl23", "libmpfr6", "libmpc3", "cpp-12", "cpp", "libcc1-0", "libgomp1", "libitm1",
    "libatomic1", "libasan8", "liblsan0", "libtsan2", "libubsan1", "libquadmath0", "libgcc-12-dev", "gcc-12",
    "gcc", "libc-dev-bin", "linux-libc-dev", "libcrypt-dev", "libtirpc-dev", "libnsl-dev", "rpcsvc-proto",
    "libc6-dev", "libstdc++-12-dev", "g++-12",
    # libpython3-dev's beyond the base image: libpython3.11-dev and libpython3.11 depend on the
    # base image's own Python 3.11 at their exact version, which the mirror does not carry, so that
    # no host is offered an upgrade of its base. They are taken from the suite the base image is
    # built from (``_download``: bookworm, not bookworm-security, whose newer point release of
    # Python 3.11 the base does not have); a base image older than that suite's point release is
    # rebuilt: ``rm -r /var/cache/kimi-cluster/base-*``
    "libexpat1-dev", "libpython3.11", "zlib1g-dev", "libpython3.11-dev",
)  # fmt: skip
# What a host running the Mooncake master or its store client gets (kimi_deploy.releases.host_libraries,
# Debian 12's names): libcurl4, libibverbs1 and ibverbs-providers with the two libnl libraries they
# depend on, and libnuma1; their other dependencies (adduser, libc6, and libcurl4's: libssl3,
# libnghttp2-14, libssh2-1, ...) are in the base image, as curl is (tests/localcluster/test_debian_live.py).
MOONCAKE_PACKAGES = (
    *library_packages(tuple(dict.fromkeys(MOONCAKE_MASTER + MOONCAKE_CLIENT)), None),
    "libnl-3-200",
    "libnl-route-3-200",
)
# What an HGX B300 host gets beside NVIDIA's nvlsm: infiniband-diags (ibstat, which the fabric
# manager's start script runs) with its three libraries; its other dependencies (perl, libc6) are in
# the base image.
NVLSM_PACKAGES = ("infiniband-diags", "libibmad5", "libibnetdisc5", "libibumad3")
# What an operator adds to read the watchdog's metrics: Debian's node exporter, whose textfile
# collector reads /var/lib/prometheus/node-exporter (its README.textfile); its dependencies
# (adduser, libc6, init-system-helpers) are in the base image.
NODE_EXPORTER_PACKAGES = ("prometheus-node-exporter",)
DEBIAN_PACKAGES = tuple(
    dict.fromkeys(
        NGINX_PACKAGES
        + CPU_ENGINE_PACKAGES
        + COMPILER_CLOSURE
        + MOONCAKE_PACKAGES
        + NVLSM_PACKAGES
        + NODE_EXPORTER_PACKAGES
    )
)
CACHE_NAME = "debian-debs"
# what was downloaded, by package; named by the suite the packages were taken from
STAMP = f".done-{SUITE}"
DOWNLOAD_TIMEOUT_S = 600


def _download(into: Path, packages: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    # apt downloads as its sandbox user _apt, which must be able to write here.
    with contextlib.suppress(LookupError, PermissionError):
        shutil.chown(into, user="_apt")
    # each package from the suite the base image is built from (localcluster.image.SUITE) where it
    # has one: the controller's apt may also know bookworm-security, whose point releases of the
    # base's own packages (Python 3.11) a package built against them would need
    return subprocess.run(
        ["apt-get", "download", "-q", "-t", SUITE, *packages],
        cwd=into,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=DOWNLOAD_TIMEOUT_S,
        check=False,
    )


def _fetch(cache: Path, packages: tuple[str, ...]) -> list[str]:
    """Download ``packages`` into ``cache``; return the file names, one per package."""
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        where = Path(tmp)
        with cache_lock(APT_LOCK):
            got = _download(where, packages)
            if got.returncode != 0:
                # A controller whose package lists were never fetched knows no candidates yet.
                log.info("debian debs: apt-get download failed, running apt-get update once")
                run(["apt-get", "update", "-q"], timeout=DOWNLOAD_TIMEOUT_S)
                got = _download(where, packages)
        if got.returncode != 0:
            lines = (got.stderr.strip() or got.stdout.strip()).splitlines()
            raise ClusterError(
                f"controller: apt-get download {' '.join(packages)}: exit {got.returncode}: "
                f"{lines[-1] if lines else 'no output'}"
            )
        debs = sorted(where.glob("*.deb"))
        by_package = {run(["dpkg-deb", "--field", str(deb), "Package"]).stdout.strip(): deb for deb in debs}
        if len(debs) != len(packages) or sorted(by_package) != sorted(packages):
            raise ClusterError(f"controller: apt-get download gave {sorted(by_package)}, not {sorted(packages)}")
        names = []
        for package in packages:
            deb = by_package[package]
            os.chown(deb, os.getuid(), os.getgid())
            deb.chmod(0o644)
            os.replace(deb, cache / deb.name)
            names.append(deb.name)
        return names


def ensure(cache_dir: Path, packages: tuple[str, ...] = DEBIAN_PACKAGES) -> list[Path]:
    """The cached .deb files of ``packages`` (one each), downloaded when the cache lacks them."""
    cache = cache_dir / CACHE_NAME
    stamp = cache / STAMP
    with cache_lock(cache):
        try:
            recorded: dict[str, str] = json.loads(stamp.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            recorded = {}
        if sorted(recorded) != sorted(packages) or not all((cache / n).is_file() for n in recorded.values()):
            stamp.unlink(missing_ok=True)
            for old in cache.glob("*.deb"):
                old.unlink()
            log.info("debian debs: downloading %s", " ".join(packages))
            recorded = dict(zip(packages, _fetch(cache, packages), strict=True))
            stamp.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return [cache / recorded[p] for p in packages]
