"""End to end on a one-host cluster of its own: Debian's real nginx from the cluster's Debian mirror.

A host, configured at creation with the mirror as its only apt source (``debian.sources``, signed-by
the cluster's key), runs ``apt-get update && apt-get install nginx libnginx-mod-http-js`` with
signature checking on; without the key apt refuses the mirror. Then the behaviour the deploy relies
on: with ``/etc/systemd/system/nginx.service`` masked (a link to /dev/null) before the install, the
install still succeeds, and nginx is neither running nor listening on port 80 afterwards. Each test
leaves the host as it found it (nginx purged, no mask).

Its subnet is ``KIMI_DEBIAN_TEST_SUBNET`` (default 10.213.15.0/24), see ``own_cluster``.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Iterator

import pytest

from localcluster import debian_debs, debian_sources
from localcluster.repo_signing import ensure_key, public_key
from tests.localcluster.conftest import Cluster
from tests.localcluster.own_cluster import own_cluster

pytestmark = pytest.mark.localcluster

HOST = "kimi-h1"
APT = "DEBIAN_FRONTEND=noninteractive apt-get -q -y"
PACKAGES = "nginx libnginx-mod-http-js"
MASK = "/etc/systemd/system/nginx.service"
# Puts the host back as it was: no nginx (nor its configuration), no mask.
PURGE = (
    f"systemctl stop nginx.service 2>/dev/null; {APT} purge nginx nginx-common libnginx-mod-http-js"
    f" && rm -f {MASK} && systemctl daemon-reload"
)


@pytest.fixture(scope="module")
def deb_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with own_cluster(tmp_path_factory, "KIMI_DEBIAN_TEST_SUBNET", "10.213.15.0/24", "--hosts", "1") as cluster:
        yield cluster


@pytest.fixture
def clean_host(deb_cluster: Cluster) -> Iterator[Cluster]:
    """The host without nginx before the test and again after it, whatever the test did."""
    assert "nginx" not in sh(deb_cluster, "dpkg-query -W -f '${Package} ${Status}\\n' 'nginx*' 2>/dev/null || true")
    assert not port_80(deb_cluster)
    try:
        yield deb_cluster
    finally:
        sh(deb_cluster, PURGE)
        assert not port_80(deb_cluster)


def sh(cluster: Cluster, command: str) -> str:
    return cluster.ssh(HOST, command).stdout


def port_80(cluster: Cluster) -> list[str]:
    """The sockets listening on TCP port 80 (``ss -ltn``), one line each."""
    listening = sh(cluster, "ss -H -ltn")
    return [line for line in listening.splitlines() if line.split()[3].rsplit(":", 1)[-1] == "80"]


def update(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    return cluster.ssh(HOST, "apt-get -q update", check=False)


def test_the_host_uses_the_mirror_signed_by_the_cluster_key(deb_cluster: Cluster) -> None:
    settings = deb_cluster.settings
    source = sh(deb_cluster, f"cat /{debian_sources.SOURCES_FILE}")
    assert source == debian_sources.sources(f"http://{settings.gateway}:8767/debian")
    home = debian_sources.signing_key_home(settings)
    key = hashlib.sha256(public_key(home, ensure_key(home))).hexdigest()
    assert sh(deb_cluster, f"sha256sum /{debian_sources.KEYRING_FILE}").split()[0] == key
    # Nothing else: the base image's sources.list names no source.
    assert sh(deb_cluster, "ls /etc/apt/sources.list.d").split() == ["debian.sources"]
    assert sh(deb_cluster, "grep -v '^#' /etc/apt/sources.list || true").strip() == ""


def test_apt_installs_nginx_and_its_js_module_from_the_mirror(clean_host: Cluster) -> None:
    c = clean_host
    refreshed = update(c)
    assert refreshed.returncode == 0, refreshed.stdout + refreshed.stderr
    assert f"http://{c.settings.gateway}:8767/debian bookworm InRelease" in refreshed.stdout
    assert "W:" not in refreshed.stderr, refreshed.stderr
    assert "E:" not in refreshed.stderr, refreshed.stderr
    out = sh(c, f"{APT} install {PACKAGES}")
    # Every other dependency is in the base image already.
    assert sorted(re.findall(r"^Unpacking (\S+) ", out, re.MULTILINE)) == sorted(debian_debs.NGINX_PACKAGES)
    installed = dict(
        line.split() for line in sh(c, "dpkg-query -W nginx nginx-common libnginx-mod-http-js").splitlines()
    )
    cached = debian_debs.ensure(c.settings.cache_dir)
    versions = {
        deb.name.split("_")[0]: subprocess.run(
            ["dpkg-deb", "--field", str(deb), "Version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for deb in cached
        if deb.name.split("_")[0] in debian_debs.NGINX_PACKAGES
    }
    assert installed == versions
    assert "load_module modules/ngx_http_js_module.so;" in sh(c, "cat /etc/nginx/modules-enabled/50-mod-http-js.conf")
    sh(c, "nginx -t")
    # Unmasked, the package starts nginx on port 80 at once (the masked case below must not).
    assert sh(c, "systemctl is-active nginx.service").strip() == "active"
    assert port_80(c)


def test_apt_installs_what_the_nvlink_subnet_manager_needs_from_the_mirror(clean_host: Cluster) -> None:
    c = clean_host
    assert update(c).returncode == 0
    out = sh(c, f"{APT} install infiniband-diags")
    # Its libraries come along; perl and libc6 are in the base image.
    unpacked = [
        name.removesuffix(":amd64").removesuffix(":arm64") for name in re.findall(r"^Unpacking (\S+) ", out, re.M)
    ]
    assert sorted(unpacked) == sorted(debian_debs.NVLSM_PACKAGES)
    assert sh(c, "command -v ibstat").strip() == "/usr/sbin/ibstat"


def test_apt_refuses_the_mirror_without_the_cluster_key(deb_cluster: Cluster) -> None:
    keyring = f"/{debian_sources.KEYRING_FILE}"
    # Without lists from before: with them apt only warns and keeps the old (signed) ones.
    sh(deb_cluster, f"mv {keyring} {keyring}.away && find /var/lib/apt/lists -type f -delete")
    try:
        refused = update(deb_cluster)
        policy = sh(deb_cluster, "apt-cache policy nginx")
    finally:
        sh(deb_cluster, f"mv {keyring}.away {keyring}")
    assert refused.returncode == 100, refused.stdout + refused.stderr
    assert "NO_PUBKEY" in refused.stderr, refused.stderr
    assert "is not signed" in refused.stderr, refused.stderr
    assert "Candidate: (none)" in policy or not policy.strip(), policy
    assert update(deb_cluster).returncode == 0


def test_a_masked_nginx_installs_and_stays_stopped(clean_host: Cluster) -> None:
    c = clean_host
    sh(c, f"ln -s /dev/null {MASK}")
    assert update(c).returncode == 0
    install = c.ssh(HOST, f"{APT} install {PACKAGES}", check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    assert "nginx.service is a disabled or a static unit, not starting it." in install.stdout
    assert c.ssh(HOST, "systemctl is-active nginx.service", check=False).stdout.strip() == "inactive"
    assert c.ssh(HOST, "systemctl is-enabled nginx.service", check=False).stdout.strip() == "masked"
    assert c.ssh(HOST, "pgrep -x nginx", check=False).returncode == 1
    assert port_80(c) == []
    # Installed completely all the same: unmasked, it starts. The package never enabled it, though.
    sh(c, f"rm {MASK} && systemctl daemon-reload")
    assert c.ssh(HOST, "systemctl is-enabled nginx.service", check=False).stdout.strip() == "disabled"
    sh(c, "systemctl start nginx.service")
    assert port_80(c)
