"""The cluster's Debian mirror without a cluster: cached real debs, indexes, signature, and apt itself.

The mirror is built as the ``apt`` service builds it, from the debs cached in the cluster's cache
directory (``KIMI_CLUSTER_CACHE``, default /var/cache/kimi-cluster; downloaded there with
``apt-get download`` on first use), and served over HTTP on loopback; the controller's own apt
reads it in a sandbox and installs nothing. Installing on a host is in test_debian_live.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import debian_debs, debian_repo, debian_sources
from localcluster.repo_index import dpkg_architecture
from localcluster.repo_signing import ensure_key, public_key, signing_home
from localcluster.state import Settings
from localcluster.static_files import StaticServer, serve
from tests.localcluster.test_nvidia_repo import Apt

TOOLS = ("apt-get", "dpkg-deb", "gpg", "gpg-agent", "gpgconf", "gpgv")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]
# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)}"), pytest.mark.processes]
HASHES = {"MD5sum": "md5", "SHA1": "sha1", "SHA256": "sha256", "SHA512": "sha512"}


@dataclasses.dataclass
class Mirror:
    root: Path  # the apt service's root
    directory: Path  # root/public/debian
    debs: list[Path]  # the cached debs it was built from
    server: StaticServer

    @property
    def url(self) -> str:
        return f"{self.server.url}{debian_sources.URL_PATH}"

    @property
    def dist(self) -> Path:
        return self.directory / "dists" / "bookworm"

    def key(self) -> bytes:
        home = signing_home(self.root)
        return public_key(home, ensure_key(home))


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    cache = Settings.from_env().cache_dir
    root = tmp_path_factory.mktemp("debian-mirror")
    server = serve(root, "127.0.0.1", 0)
    try:
        yield Mirror(root, debian_repo.build(root, cache), debian_debs.ensure(cache), server)
    finally:
        server.stop()


def stanzas(text: str) -> list[dict[str, str]]:
    """deb822 paragraphs as field -> value (continuation lines joined with newlines, comments left out)."""
    out = []
    for paragraph in text.strip().split("\n\n"):
        fields: dict[str, str] = {}
        name = ""
        for line in paragraph.splitlines():
            if line.startswith("#"):
                continue
            if line[:1].isspace():
                fields[name] += "\n" + line
            else:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        out.append(fields)
    return out


def field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_cache_holds_one_real_debian_deb_per_package(mirror: Mirror) -> None:
    assert [field(deb, "Package") for deb in mirror.debs] == list(debian_debs.DEBIAN_PACKAGES)
    for deb in mirror.debs:
        # Debian's own file: the controller's apt lists (from its Debian mirror) name this very hash.
        wanted = f"{field(deb, 'Package')}={field(deb, 'Version')}"
        shown = subprocess.run(["apt-cache", "show", wanted], capture_output=True, text=True, check=True).stdout
        assert f"SHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}" in shown, wanted


def test_a_second_build_downloads_nothing(mirror: Mirror, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_download(*args: object) -> None:
        raise AssertionError(f"downloaded again: {args}")

    monkeypatch.setattr(debian_debs, "_download", no_download)
    again = debian_repo.build(tmp_path, Settings.from_env().cache_dir)
    assert sorted(p.name for p in again.rglob("*.deb")) == sorted(p.name for p in mirror.debs)


def test_packages_lists_exactly_the_cached_debs_with_their_sizes_and_hashes(mirror: Mirror) -> None:
    index = mirror.dist / "main" / f"binary-{dpkg_architecture()}"
    packages = (index / "Packages").read_bytes()
    assert gzip.decompress((index / "Packages.gz").read_bytes()) == packages
    listed = {s["Package"]: s for s in stanzas(packages.decode())}
    assert sorted(listed) == sorted(debian_debs.DEBIAN_PACKAGES)
    for deb in mirror.debs:
        entry = listed[field(deb, "Package")]
        data = deb.read_bytes()
        assert (mirror.directory / entry["Filename"]).read_bytes() == data
        assert entry["Filename"].startswith("pool/main/")
        assert int(entry["Size"]) == len(data)
        for name, algorithm in HASHES.items():
            assert entry[name] == hashlib.new(algorithm, data).hexdigest(), (deb.name, name)
        assert entry["Version"] == field(deb, "Version")
        # a package that depends on nothing (linux-libc-dev) has no Depends field, here as in the .deb
        assert entry.get("Depends", "") == field(deb, "Depends")


def test_release_describes_bookworm_main_and_hashes_its_indexes(mirror: Mirror) -> None:
    release = stanzas((mirror.dist / "Release").read_text())[0]
    arch = dpkg_architecture()
    assert (release["Origin"], release["Label"], release["Suite"], release["Codename"]) == (
        "Debian",
        "Debian",
        "bookworm",
        "bookworm",
    )
    assert (release["Architectures"], release["Components"]) == (arch, "main")
    assert release["Date"].endswith("GMT")
    for name, algorithm in {"MD5Sum": "md5", "SHA1": "sha1", "SHA256": "sha256", "SHA512": "sha512"}.items():
        rows = [line.split() for line in release[name].strip().splitlines()]
        assert sorted(row[2] for row in rows) == [f"main/binary-{arch}/Packages", f"main/binary-{arch}/Packages.gz"]
        for digest, size, path in rows:
            data = (mirror.dist / path).read_bytes()
            assert (digest, int(size)) == (hashlib.new(algorithm, data).hexdigest(), len(data)), (name, path)


def test_inrelease_and_release_gpg_verify_against_the_exported_key(mirror: Mirror, tmp_path: Path) -> None:
    keyring = tmp_path / "kimi-cluster-debian.gpg"
    keyring.write_bytes(mirror.key())

    def gpgv(*files: Path, key: Path = keyring) -> subprocess.CompletedProcess[str]:
        argv = ["gpgv", "--keyring", str(key), *map(str, files)]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    assert gpgv(mirror.dist / "InRelease").returncode == 0
    assert gpgv(mirror.dist / "Release.gpg", mirror.dist / "Release").returncode == 0
    signed = (mirror.dist / "InRelease").read_text()
    assert (mirror.dist / "Release").read_text() in signed
    other_home = tmp_path / "other"
    other = tmp_path / "other.gpg"
    other.write_bytes(public_key(other_home, ensure_key(other_home)))
    assert gpgv(mirror.dist / "InRelease", key=other).returncode != 0


def test_a_host_gets_a_deb822_source_and_the_cluster_key(mirror: Mirror, tmp_path: Path) -> None:
    settings = Settings(tmp_path / "state", tmp_path / "cache", Settings.from_env({}).subnet)
    # The host side finds the key where the apt service keeps it: <state>/apt/signing.
    shutil.copytree(signing_home(mirror.root), debian_sources.signing_key_home(settings))
    host = tmp_path / "merged"
    debian_sources.write(settings, host)
    source = (host / "etc/apt/sources.list.d/debian.sources").read_text()
    assert stanzas(source)[0] == {
        "Types": "deb",
        "URIs": "http://10.213.7.1:8767/debian",
        "Suites": "bookworm",
        "Components": "main",
        "Signed-By": "/usr/share/keyrings/kimi-cluster-debian.gpg",
    }
    keyring = host / "usr/share/keyrings/kimi-cluster-debian.gpg"
    assert keyring.read_bytes() == mirror.key()
    assert keyring.stat().st_mode & 0o777 == 0o644


@pytest.fixture
def apt(mirror: Mirror, tmp_path: Path) -> Apt:
    """A sandbox (see test_nvidia_repo.Apt) whose only source is the mirror, signed-by its key."""
    sandbox = Apt(tmp_path / "apt")
    sources_d = sandbox.root / "etc/apt/sources.list.d"
    sources_d.mkdir(parents=True)
    (sandbox.root / "var/lib/apt/lists/partial").mkdir(parents=True)
    (sandbox.root / "status").touch()
    keyring = sandbox.root / "debian.gpg"
    keyring.write_bytes(mirror.key())
    source = debian_sources.sources(mirror.url).replace(f"/{debian_sources.KEYRING_FILE}", str(keyring))
    (sources_d / "debian.sources").write_text(source)
    return sandbox


def test_apt_takes_the_mirror_signed_and_offers_the_cached_versions(apt: Apt, mirror: Mirror) -> None:
    update = apt("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr, update.stderr
    assert "E:" not in update.stderr, update.stderr
    for deb in mirror.debs:
        policy = apt("apt-cache", "policy", field(deb, "Package")).stdout
        assert f"Candidate: {field(deb, 'Version')}" in policy, policy
        assert f"{mirror.url} bookworm/main" in policy, policy


def test_apt_refuses_the_mirror_without_its_key(apt: Apt, mirror: Mirror, tmp_path: Path) -> None:
    other_home = tmp_path / "other"
    (apt.root / "debian.gpg").write_bytes(public_key(other_home, ensure_key(other_home)))
    update = apt("apt-get", "update")
    assert update.returncode != 0
    assert "NO_PUBKEY" in update.stderr or "is not signed" in update.stderr, update.stderr
    assert "nginx" not in apt("apt-cache", "pkgnames", "nginx").stdout.split()
