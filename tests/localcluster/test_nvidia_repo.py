"""The stand-in NVIDIA apt repository without a cluster: packages, index, signature, and apt itself.

The repository is built as the cluster builds it and served over HTTP on loopback; the controller's
own apt reads it in a sandbox (its own state, sources, preferences and an empty or made-up dpkg
status) and only simulates (``-s``), so nothing is installed here. What the packages do once
installed is tested on the driver-state helper directly, and end to end in test_nvidia_live.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from localcluster import apt_repo, bootloop, nvidia_debs
from localcluster.fake_nvidia import CONFIG_PATH, install
from localcluster.hosts import is_running
from localcluster.state import HostRecord
from localcluster.static_files import StaticServer, serve

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

STANDINS = Path(nvidia_debs.__file__).resolve().parent / "standins"
DRIVER = "580.95.05"
NEWER = "580.105.08"
OTHER_BRANCH = "590.48.01"
TOOLS = ("dpkg-deb", "gpg", "gpg-agent", "gpgconf", "gpgv", "apt-get")


@dataclasses.dataclass
class Repo:
    root: Path
    url: str  # what state.json records: .../compute/cuda/repos
    directory: Path  # the flat repository: .../debian12/x86_64
    server: StaticServer

    @property
    def repo_url(self) -> str:
        return f"{self.url}/debian12/{apt_repo.REPO_ARCHES[apt_repo.deb_architecture()]}/"

    def deb(self, name: str) -> Path:
        found = sorted(self.directory.glob(f"{name}_*.deb"))
        assert len(found) == 1, f"{name}: {found}"
        return found[0]

    def driver_deb(self, name: str, driver: str) -> Path:
        found = sorted(self.directory.glob(f"{name}_{driver}-1_*.deb"))
        assert len(found) == 1, f"{name} {driver}: {found}"
        return found[0]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repo]:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    root = tmp_path_factory.mktemp("apt")
    server = serve(root, "127.0.0.1", 0)
    url = f"{server.url}/compute/cuda/repos"
    directory = apt_repo.build(root, url)
    yield Repo(root, url, directory, server)
    server.stop()


def field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def _data(deb: Path) -> tarfile.TarFile:
    tar_bytes = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    return tarfile.open(fileobj=io.BytesIO(tar_bytes))


def members(deb: Path) -> dict[str, bytes]:
    """Path -> content of each regular file a package installs."""
    out = {}
    with _data(deb) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is not None:
                out[member.name.removeprefix(".")] = extracted.read()
    return out


def text(deb: Path, path: str) -> str:
    return members(deb)[path].decode()


def links(deb: Path) -> dict[str, str]:
    """Path -> target of each symbolic link a package installs."""
    with _data(deb) as tar:
        return {m.name.removeprefix("."): m.linkname for m in tar.getmembers() if m.issym()}


def control_file(deb: Path, name: str) -> str:
    tar_bytes = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        extracted = tar.extractfile(f"./{name}")
        assert extracted is not None
        return extracted.read().decode()


# ---- packages ---------------------------------------------------------------------------------------


def test_packages_mirror_nvidia_names_and_versions(repo: Repo) -> None:
    names = {p.name for p in repo.directory.glob("*.deb")}
    arch = apt_repo.deb_architecture()
    expected = {"cuda-keyring_1.1-1_all.deb"}
    expected |= {f"nvidia-driver-pinning-{t}_{t}-1_all.deb" for t in ("580", "590", DRIVER, NEWER, OTHER_BRANCH)}
    expected |= {
        f"{name}_{driver}-1_{arch}.deb"
        for driver in (DRIVER, NEWER, OTHER_BRANCH)
        for name in (
            "nvidia-open",
            "nvidia-driver-cuda",
            "nvidia-kernel-common",
            "nvidia-kernel-open-dkms",
            "nvidia-fabricmanager",
            "nvidia-imex",
        )
    }
    expected.add(f"nvlsm_{nvidia_debs.NVLSM_VERSION}_{arch}.deb")
    assert names == expected
    info = subprocess.run(
        ["dpkg-deb", "--info", str(repo.deb("cuda-keyring"))], capture_output=True, text=True, check=False
    )
    assert info.returncode == 0
    assert " Package: cuda-keyring\n Version: 1.1-1\n Architecture: all\n" in info.stdout


def test_the_ubuntu_tree_names_the_compute_packages_as_ubuntus_does(repo: Repo) -> None:
    """Ubuntu 24.04 hosts read ``ubuntu2404``: the compute packages named by branch up to 580 and
    not from 590, every revision ``-1ubuntu1``; the fabric manager and IMEX keep their names."""
    arch = apt_repo.deb_architecture()
    tree = apt_repo.repo_dir(repo.root, repo.url, arch, apt_repo.UBUNTU_TREE)
    names = {p.name for p in tree.glob("*.deb")}
    for name in (
        f"libnvidia-compute-580_{DRIVER}",
        f"nvidia-dkms-580-open_{DRIVER}",
        f"nvidia-kernel-common-580_{NEWER}",
        f"libnvidia-compute_{OTHER_BRANCH}",
        f"nvidia-dkms-open_{OTHER_BRANCH}",
        f"nvidia-imex_{DRIVER}",
        f"nvidia-fabricmanager_{DRIVER}",
    ):
        assert f"{name}-1ubuntu1_{arch}.deb" in names, name
    assert {
        "nvidia-driver-pinning-580_580-1ubuntu1_all.deb",
        f"nvidia-driver-pinning-{DRIVER}_{DRIVER}-1ubuntu1_all.deb",
    } <= names
    assert not [n for n in names if n.startswith(("nvidia-driver-cuda_", "nvidia-kernel-open-dkms_"))]
    dkms = tree / f"nvidia-dkms-580-open_{DRIVER}-1ubuntu1_{arch}.deb"
    assert field(dkms, "Depends") == f"nvidia-kernel-common-580 (= {DRIVER}-1ubuntu1)"
    assert field(dkms, "Conflicts") == "nvidia-dkms-580"
    prefs = text(
        tree / f"nvidia-driver-pinning-{DRIVER}_{DRIVER}-1ubuntu1_all.deb",
        f"/etc/apt/preferences.d/nvidia-driver-pinning-{DRIVER}.pref",
    )
    pinned = prefs.split("Package:")[1].splitlines()[0].split()
    assert {"libnvidia-compute-580", "nvidia-dkms-580-open", "libnvidia-compute", "nvidia-imex"} <= set(pinned)
    keyring = members(tree / "cuda-keyring_1.1-1_all.deb")
    assert f"/etc/apt/sources.list.d/cuda-ubuntu2404-{apt_repo.REPO_ARCHES[arch]}.list" in keyring


def test_every_driver_piece_depends_on_the_same_version(repo: Repo) -> None:
    fm = repo.driver_deb("nvidia-fabricmanager", DRIVER)
    assert field(fm, "Depends") == f"nvidia-kernel-common (= {DRIVER}-1)"
    assert field(repo.driver_deb("nvidia-imex", NEWER), "Depends") == f"nvidia-kernel-common (= {NEWER}-1)"
    assert field(repo.driver_deb("nvidia-open", DRIVER), "Depends") == (
        f"nvidia-driver-cuda (= {DRIVER}-1), nvidia-kernel-open-dkms (= {DRIVER}-1)"
    )
    dkms = repo.driver_deb("nvidia-kernel-open-dkms", DRIVER)
    assert field(dkms, "Depends") == f"nvidia-kernel-common (= {DRIVER}-1)"
    assert field(dkms, "Conflicts") == "nvidia-kernel-dkms"
    assert f'PACKAGE_VERSION="{DRIVER}"' in text(dkms, f"/usr/src/nvidia-{DRIVER}/dkms.conf")


def test_fabric_manager_and_imex_ship_their_units_and_config(repo: Repo) -> None:
    fm = members(repo.driver_deb("nvidia-fabricmanager", DRIVER))
    unit = fm["/lib/systemd/system/nvidia-fabricmanager.service"].decode()
    assert "ExecStartPre=/usr/bin/nvidia-fabricmanager-start.sh --mode precheck" in unit
    assert "ExecStart=/usr/bin/nvidia-fabricmanager-start.sh --mode start" in unit
    assert "/usr/share/nvidia/nvswitch/fabricmanager.cfg" in fm
    assert f'VERSION="{DRIVER}"' in fm["/usr/bin/nv-fabricmanager"].decode()
    assert "exec /usr/bin/nv-fabricmanager" in fm["/usr/bin/nvidia-fabricmanager-start.sh"].decode()
    # The NVLink subnet manager: its own version, Debian's libibumad3, the configuration the start script reads.
    nvlsm = repo.deb("nvlsm")
    assert (field(nvlsm, "Version"), field(nvlsm, "Depends")) == (nvidia_debs.NVLSM_VERSION, "libibumad3")
    assert {"/usr/share/nvidia/nvlsm/nvlsm.conf", "/opt/nvidia/nvlsm/sbin/nvlsm"} <= set(members(nvlsm))
    imex_deb = repo.driver_deb("nvidia-imex", DRIVER)
    imex = members(imex_deb)
    assert (
        "ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg"
        in imex["/lib/systemd/system/nvidia-imex.service"].decode()
    )
    assert "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg" in imex["/etc/nvidia-imex/config.cfg"].decode()
    # A deploy writes the node list; an upgrade must keep it.
    assert control_file(imex_deb, "conffiles").split() == [
        "/etc/nvidia-imex/config.cfg",
        "/etc/nvidia-imex/nodes_config.cfg",
    ]


def test_driver_packages_change_the_host_in_their_maintainer_scripts(repo: Repo) -> None:
    cuda = repo.driver_deb("nvidia-driver-cuda", NEWER)
    assert f"/usr/lib/nvidia/standin-driver-state userspace-installed {NEWER} nvidia-driver-cuda" in control_file(
        cuda, "postinst"
    )
    assert "userspace-removed" in control_file(cuda, "postrm")
    assert "/usr/bin/nvidia-smi" in members(cuda)
    dkms = repo.driver_deb("nvidia-kernel-open-dkms", NEWER)
    assert f"standin-driver-state module-installed {NEWER} nvidia-kernel-open-dkms" in control_file(dkms, "postinst")
    common = repo.driver_deb("nvidia-kernel-common", NEWER)
    wanted = links(common)["/lib/systemd/system/sysinit.target.wants/nvidia-standin-boot.service"]
    assert wanted == "../nvidia-standin-boot.service"
    unit = text(common, "/lib/systemd/system/nvidia-standin-boot.service")
    assert "ExecStart=/usr/lib/nvidia/standin-driver-state boot" in unit
    assert "WantedBy=sysinit.target" in unit


def test_pinning_packages_pin_a_branch_or_a_version_and_exclude_each_other(repo: Repo) -> None:
    branch = repo.deb("nvidia-driver-pinning-580")
    assert field(branch, "Description").splitlines()[0] == "APT driver pinning file for driver branch 580"
    for name in ("Provides", "Conflicts", "Replaces"):
        assert field(branch, name) == "nvidia-driver-pinning"
    prefs = text(branch, "/etc/apt/preferences.d/nvidia-driver-pinning-580.pref")
    assert "Pin: version 580.*\nPin-Priority: 1000\n" in prefs
    assert "nvidia-fabricmanager" in prefs.split("Package:")[1].splitlines()[0].split()
    exact = text(
        repo.deb(f"nvidia-driver-pinning-{DRIVER}"), f"/etc/apt/preferences.d/nvidia-driver-pinning-{DRIVER}.pref"
    )
    assert f"Pin: version {DRIVER}-*\n" in exact


def test_keyring_installs_key_source_and_pin_like_cuda_keyring(repo: Repo) -> None:
    files = members(repo.deb("cuda-keyring"))
    arch_dir = apt_repo.REPO_ARCHES[apt_repo.deb_architecture()]
    source = files[f"/etc/apt/sources.list.d/cuda-debian12-{arch_dir}.list"]
    assert source == f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {repo.repo_url} /\n".encode()
    assert (
        files["/etc/apt/preferences.d/cuda-repository-pin-600"]
        == b"Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n"
    )
    assert control_file(repo.deb("cuda-keyring"), "conffiles").split() == [
        f"/etc/apt/sources.list.d/cuda-debian12-{arch_dir}.list",
        "/etc/apt/preferences.d/cuda-repository-pin-600",
    ]


def test_packages_are_rebuilt_byte_for_byte(repo: Repo, tmp_path: Path) -> None:
    deb = nvidia_debs.driver_debs(DRIVER, apt_repo.deb_architecture())[-1]
    first = nvidia_debs.build_deb(deb, tmp_path / "a").read_bytes()
    time.sleep(1.1)
    assert nvidia_debs.build_deb(deb, tmp_path / "b").read_bytes() == first
    assert (repo.directory / deb.filename).read_bytes() == first


# ---- index and signature ----------------------------------------------------------------------------


def keyring(repo: Repo, tmp_path: Path) -> Path:
    path = tmp_path / "cuda-archive-keyring.gpg"
    path.write_bytes(members(repo.deb("cuda-keyring"))["/usr/share/keyrings/cuda-archive-keyring.gpg"])
    return path


def gpgv(key: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["gpgv", "--keyring", str(key), *map(str, files)], capture_output=True, text=True, check=False
    )


def test_release_is_signed_with_the_key_cuda_keyring_ships(repo: Repo, tmp_path: Path) -> None:
    key = keyring(repo, tmp_path)
    assert gpgv(key, repo.directory / "InRelease").returncode == 0
    assert gpgv(key, repo.directory / "Release.gpg", repo.directory / "Release").returncode == 0
    tampered = tmp_path / "Release"
    tampered.write_text((repo.directory / "Release").read_text().replace("Label: NVIDIA CUDA", "Label: other"))
    assert gpgv(key, repo.directory / "Release.gpg", tampered).returncode != 0
    armored = list(repo.directory.glob("*.pub"))
    assert len(armored) == 1
    assert armored[0].read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_release_and_packages_describe_the_files_served(repo: Repo) -> None:
    release = (repo.directory / "Release").read_text()
    assert release.startswith("Origin: NVIDIA\nLabel: NVIDIA CUDA\n")
    sha256 = release.split("SHA256:\n")[1].split("SHA512:")[0]
    for line in sha256.splitlines():
        digest, size, name = line.split()
        data = (repo.directory / name).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), int(size)) == (digest, len(data))
    packages = (repo.directory / "Packages").read_text()
    assert gzip.decompress((repo.directory / "Packages.gz").read_bytes()).decode() == packages
    stanzas = [dict(re.findall(r"^(\S+): (.*)$", s, re.MULTILINE)) for s in packages.strip().split("\n\n")]
    assert len(stanzas) == len(list(repo.directory.glob("*.deb")))
    for stanza in stanzas:
        deb = repo.directory / stanza["Filename"].removeprefix("./")
        assert stanza["Size"] == str(deb.stat().st_size)
        assert stanza["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert stanza["MD5sum"] == hashlib.md5(deb.read_bytes()).hexdigest()


def test_the_signing_key_is_made_once_and_no_agent_is_left(repo: Repo) -> None:
    before = members(repo.deb("cuda-keyring"))["/usr/share/keyrings/cuda-archive-keyring.gpg"]
    apt_repo.build(repo.root, repo.url)
    assert members(repo.deb("cuda-keyring"))["/usr/share/keyrings/cuda-archive-keyring.gpg"] == before
    home = str(repo.root / "signing")
    agents = [p for p in Path("/proc").iterdir() if p.name.isdigit() and home.encode() in _cmdline(p)]
    assert agents == []
    assert not (repo.root / "public" / "signing").exists()


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_the_server_serves_public_files_only(repo: Repo) -> None:
    host, port = repo.server.server_address[:2]

    def get(path: str, method: str = "GET") -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(str(host), port, timeout=5)
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read()
        conn.close()
        return response.status, body

    prefix = "/compute/cuda/repos/debian12/" + repo.directory.name
    status, body = get(f"{prefix}/InRelease")
    assert (status, body) == (200, (repo.directory / "InRelease").read_bytes())
    assert get(f"{prefix}/InRelease", "HEAD")[0] == 200
    assert get(f"{prefix}/missing.deb")[0] == 404
    assert get(prefix + "/")[0] == 404
    assert get("/../signing/pubring.kbx")[0] == 404
    assert get("/%2e%2e/signing/pubring.kbx")[0] == 404


# ---- apt against the repository ---------------------------------------------------------------------


@dataclasses.dataclass
class Apt:
    """apt-get and apt-cache on the controller, confined to ``root``: own sources, pins and dpkg status."""

    root: Path

    def argv(self, tool: str, *args: str) -> list[str]:
        r = self.root
        return [
            tool,
            "-o",
            f"Dir={r}",
            "-o",
            f"Dir::State::status={r}/status",
            "-o",
            "APT::Sandbox::User=root",
            "-o",
            "Debug::NoLocking=1",
            *args,
        ]

    def __call__(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}
        return subprocess.run(self.argv(tool, *args), capture_output=True, text=True, env=env, timeout=60, check=False)

    def pin(self, deb: Path) -> None:
        for old in (self.root / "etc/apt/preferences.d").glob("nvidia-driver-pinning-*"):
            old.unlink()
        for path, data in members(deb).items():
            if path.startswith("/etc/apt/preferences.d/"):
                (self.root / path.lstrip("/")).write_bytes(data)

    def installed(self, *debs: Path) -> None:
        """Make dpkg's status say ``debs`` are installed (for simulations only)."""
        stanzas = []
        for deb in debs:
            control = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True, check=True)
            lines = control.stdout.rstrip("\n").splitlines()
            lines.insert(1, "Status: install ok installed")
            stanzas.append("\n".join(lines) + "\n")
        (self.root / "status").write_text("\n".join(stanzas))


@pytest.fixture
def apt(repo: Repo, tmp_path: Path) -> Apt:
    """A sandbox that has installed ``cuda-keyring`` (its key at a sandbox path) and run apt-get update."""
    root = tmp_path / "apt"
    for directory in (
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "etc/apt/apt.conf.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "keys",
    ):
        (root / directory).mkdir(parents=True)
    (root / "status").write_text("")
    for path, data in members(repo.deb("cuda-keyring")).items():
        if path.endswith(".gpg"):
            (root / "keys" / Path(path).name).write_bytes(data)
        else:
            (root / path.lstrip("/")).write_text(data.decode().replace("/usr/share/keyrings/", f"{root}/keys/"))
    sandbox = Apt(root)
    update = sandbox("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "W:" not in update.stderr, update.stderr
    assert "E:" not in update.stderr, update.stderr
    return sandbox


def candidate(apt: Apt, package: str) -> str:
    policy = apt("apt-cache", "policy", package).stdout
    found = re.search(r"Candidate: (\S+)", policy)
    assert found, policy
    return found.group(1)


def test_an_arm64_host_resolves_the_pinned_driver_from_the_sbsa_tree(repo: Repo, tmp_path: Path) -> None:
    """The other architecture's tree is served beside the controller's (sbsa beside x86_64): apt on
    an arm64 machine (simulated: APT::Architecture) reads it and resolves the pinned compute-only set."""
    other = next(a for a in apt_repo.REPO_ARCHES if a != apt_repo.deb_architecture())
    tree = apt_repo.repo_dir(repo.root, repo.url, other)
    assert field(tree / f"nvidia-driver-cuda_{DRIVER}-1_{other}.deb", "Architecture") == other
    root = tmp_path / "arm"
    for directory in (
        "etc/apt/sources.list.d",
        "etc/apt/preferences.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "keys",
    ):
        (root / directory).mkdir(parents=True)
    (root / "status").write_text("")
    for path, data in members(tree / "cuda-keyring_1.1-1_all.deb").items():
        if path.endswith(".gpg"):
            (root / "keys" / Path(path).name).write_bytes(data)
        else:
            (root / path.lstrip("/")).write_text(data.decode().replace("/usr/share/keyrings/", f"{root}/keys/"))
    arm = Apt(root)

    def on_arm(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return arm(tool, "-o", f"APT::Architecture={other}", "-o", f"APT::Architectures={other}", *args)

    update = on_arm("apt-get", "update")
    assert update.returncode == 0, update.stdout + update.stderr
    arm.pin(tree / f"nvidia-driver-pinning-{DRIVER}_{DRIVER}-1_all.deb")
    sim = on_arm("apt-get", "-s", "install", "nvidia-driver-cuda", "nvidia-kernel-open-dkms")
    assert sim.returncode == 0, sim.stdout + sim.stderr
    installs = sorted(re.findall(r"^Inst (\S+) \((\S+) .*\[(\S+)\]\)$", sim.stdout, re.M))
    assert installs == [
        (name, f"{DRIVER}-1", other)
        for name in ("nvidia-driver-cuda", "nvidia-kernel-common", "nvidia-kernel-open-dkms")
    ], sim.stdout


def test_apt_trusts_the_repository_only_with_its_key(apt: Apt, repo: Repo, tmp_path: Path) -> None:
    assert "nvidia-driver-cuda" in apt("apt-cache", "pkgnames", "nvidia-").stdout.split()
    other = tmp_path / "other-home"
    other_fpr = apt_repo.ensure_key(other)
    (apt.root / "keys" / "cuda-archive-keyring.gpg").write_bytes(apt_repo.public_key(other, other_fpr))
    shutil.rmtree(apt.root / "var/lib/apt/lists")
    (apt.root / "var/lib/apt/lists/partial").mkdir(parents=True)
    update = apt("apt-get", "update")
    assert "NO_PUBKEY" in update.stderr or "is not signed" in update.stderr, update.stderr
    assert "nvidia-driver-cuda" not in apt("apt-cache", "pkgnames", "nvidia-").stdout.split()


def test_without_a_pin_apt_takes_the_newest_branch(apt: Apt) -> None:
    assert candidate(apt, "nvidia-open") == f"{OTHER_BRANCH}-1"


def test_a_branch_pin_takes_the_newest_of_its_branch(apt: Apt, repo: Repo) -> None:
    apt.pin(repo.deb("nvidia-driver-pinning-580"))
    assert candidate(apt, "nvidia-open") == f"{NEWER}-1"
    assert candidate(apt, "nvidia-fabricmanager") == f"{NEWER}-1"


def test_a_version_pin_installs_that_version_compute_only(apt: Apt, repo: Repo) -> None:
    apt.pin(repo.deb(f"nvidia-driver-pinning-{DRIVER}"))
    sim = apt("apt-get", "-s", "install", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-fabricmanager")
    assert sim.returncode == 0, sim.stdout + sim.stderr
    installs = sorted(re.findall(r"^Inst (\S+) \((\S+)", sim.stdout, re.MULTILINE))
    assert installs == [
        ("nvidia-driver-cuda", f"{DRIVER}-1"),
        ("nvidia-fabricmanager", f"{DRIVER}-1"),
        ("nvidia-kernel-common", f"{DRIVER}-1"),
        ("nvidia-kernel-open-dkms", f"{DRIVER}-1"),
    ]


def test_apt_refuses_a_fabric_manager_of_another_version_than_the_driver(apt: Apt, repo: Repo) -> None:
    apt.pin(repo.deb(f"nvidia-driver-pinning-{DRIVER}"))
    apt.installed(
        repo.deb(f"nvidia-driver-pinning-{DRIVER}"),
        *(
            repo.driver_deb(n, DRIVER)
            for n in ("nvidia-kernel-common", "nvidia-driver-cuda", "nvidia-kernel-open-dkms")
        ),
    )
    for version in (NEWER, OTHER_BRANCH):
        sim = apt("apt-get", "-s", "install", f"nvidia-fabricmanager={version}-1")
        assert sim.returncode == 100
        assert (
            f"nvidia-fabricmanager : Depends: nvidia-kernel-common (= {version}-1) but {DRIVER}-1 is to be installed"
            in sim.stdout
        ), sim.stdout


def test_switching_the_version_pin_upgrades_the_driver_as_one(apt: Apt, repo: Repo) -> None:
    apt.pin(repo.deb(f"nvidia-driver-pinning-{NEWER}"))
    apt.installed(
        repo.deb(f"nvidia-driver-pinning-{DRIVER}"),
        *(
            repo.driver_deb(n, DRIVER)
            for n in ("nvidia-kernel-common", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-fabricmanager")
        ),
    )
    sim = apt("apt-get", "-s", "install", f"nvidia-driver-pinning-{NEWER}")
    assert sim.returncode == 0, sim.stdout + sim.stderr
    assert re.search(rf"^Remv nvidia-driver-pinning-{re.escape(DRIVER)} ", sim.stdout, re.MULTILINE), sim.stdout
    up = apt("apt-get", "-s", "install", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-fabricmanager")
    assert up.returncode == 0, up.stdout + up.stderr
    upgraded = sorted(
        re.findall(rf"^Inst (\S+) \[{re.escape(DRIVER)}-1\] \({re.escape(NEWER)}-1", up.stdout, re.MULTILINE)
    )
    assert upgraded == ["nvidia-driver-cuda", "nvidia-fabricmanager", "nvidia-kernel-common", "nvidia-kernel-open-dkms"]


# ---- what the driver packages do on a host ----------------------------------------------------------


@dataclasses.dataclass
class FakeHost:
    config: Path
    state: Path
    run_dir: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KIMI_FAKE_ACCELERATORS": str(self.config),
            "NVIDIA_STANDIN_STATE_DIR": str(self.state),
            "NVIDIA_STANDIN_RUN_DIR": str(self.run_dir),
        }

    def helper(self, *args: str) -> None:
        script = STANDINS / "nvidia_driver_state.py"
        subprocess.run([sys.executable, str(script), *args], env=self.env, check=True, timeout=30)

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        script = STANDINS / "nvidia_smi.py"
        return subprocess.run(
            [sys.executable, str(script), *args], env=self.env, capture_output=True, text=True, check=False
        )

    def reported(self) -> str:
        out = self.smi("--query-gpu=driver_version", "--format=csv,noheader")
        assert out.returncode == 0, out.stdout
        return out.stdout.splitlines()[0]


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    install(tmp_path / "root", "b300x8")
    return FakeHost(tmp_path / "root" / CONFIG_PATH, tmp_path / "state", tmp_path / "run")


def test_installing_the_running_version_needs_no_reboot(host: FakeHost) -> None:
    host.helper("module-installed", DRIVER, "nvidia-kernel-open-dkms")
    host.helper("userspace-installed", DRIVER, "nvidia-driver-cuda")
    assert host.reported() == DRIVER
    assert not (host.run_dir / "reboot-required").exists()


def test_an_upgrade_mismatches_until_the_next_boot(host: FakeHost) -> None:
    host.helper("userspace-installed", DRIVER, "nvidia-driver-cuda")
    host.helper("userspace-installed", NEWER, "nvidia-driver-cuda")
    host.helper("module-installed", NEWER, "nvidia-kernel-open-dkms")
    out = host.smi()
    assert (out.returncode, out.stdout) == (
        18,
        f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {NEWER}\n",
    )
    assert (host.run_dir / "reboot-required").exists()
    assert (host.run_dir / "reboot-required.pkgs").read_text().split() == [
        "nvidia-driver-cuda",
        "nvidia-kernel-open-dkms",
    ]
    host.helper("boot")
    assert host.reported() == NEWER
    host.helper("boot")
    assert json.loads(host.config.read_text())["driver_version"] == NEWER


def test_a_first_install_on_a_host_without_a_loaded_driver_loads_at_boot(host: FakeHost) -> None:
    host.config.write_text(json.dumps({**json.loads(host.config.read_text()), "driver_loaded": False}))
    host.helper("userspace-installed", NEWER, "nvidia-driver-cuda")
    host.helper("module-installed", NEWER, "nvidia-kernel-open-dkms")
    assert host.smi().returncode == 9
    assert (host.run_dir / "reboot-required").exists()
    host.helper("boot")
    assert host.reported() == NEWER


def test_boot_leaves_a_host_without_driver_packages_alone(host: FakeHost) -> None:
    before = host.config.read_bytes()
    host.helper("boot")
    host.helper("module-installed", NEWER, "nvidia-kernel-open-dkms")
    host.helper("module-removed")
    host.helper("boot")
    assert host.config.read_bytes() == before


# ---- the boot loop ----------------------------------------------------------------------------------


FAKE_NSPAWN = """\
import os, signal, sys, time
counter, codes = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
boots = len(open(counter).read().split()) if os.path.exists(counter) else 0
open(counter, "a").write("boot\\n")
def on_term(signum, frame):
    open(counter, "a").write("term\\n")
    sys.exit(int(os.environ.get("EXIT_ON_TERM", "0")))
signal.signal(signal.SIGTERM, on_term)
code = codes[min(boots, len(codes) - 1)]
if code < 0:
    time.sleep(60)
sys.exit(code)
"""


def bootloop_proc(tmp_path: Path, codes: str, **env: str) -> tuple[subprocess.Popen[bytes], Path]:
    script = tmp_path / "nspawn.py"
    script.write_text(FAKE_NSPAWN)
    counter = tmp_path / "boots"
    argv = [
        sys.executable,
        "-m",
        bootloop.MODULE,
        "--",
        sys.executable,
        str(script),
        str(counter),
        codes,
        f"--directory={tmp_path}",
    ]
    proc = subprocess.Popen(
        argv, cwd=Path(bootloop.__file__).resolve().parents[1], env={**os.environ, **env}, stdout=subprocess.DEVNULL
    )
    return proc, counter


def wait_for(predicate: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize(("codes", "status", "boots"), [("133,133,0", 0, 3), ("133,1", 1, 2), ("2", 2, 1)])
def test_boot_loop_boots_again_on_133_only(tmp_path: Path, codes: str, status: int, boots: int) -> None:
    proc, counter = bootloop_proc(tmp_path, codes)
    assert proc.wait(20) == status
    assert counter.read_text().split() == ["boot"] * boots


def test_boot_loop_stops_on_sigterm_even_when_nspawn_says_reboot(tmp_path: Path) -> None:
    proc, counter = bootloop_proc(tmp_path, "-1", EXIT_ON_TERM="133")
    wait_for(counter.exists)
    time.sleep(0.3)  # let the fake nspawn install its handler
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 133
    assert counter.read_text().split() == ["boot", "term"]


def test_a_host_record_names_its_boot_loop(tmp_path: Path) -> None:
    proc, counter = bootloop_proc(tmp_path, "-1")
    try:
        wait_for(counter.exists)
        record = HostRecord("kimi-h1", "10.0.0.1", proc.pid, str(tmp_path), "b300x8", "running")
        assert is_running(record)
        assert not is_running(dataclasses.replace(record, root=str(tmp_path / "other")))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert not is_running(record)
