"""What the releases' native programs need from the host: the ELF reader of ``tools/needed_libs.py``
held to binutils' ``readelf -d`` on real files, a wheel's own and the manylinux baseline's
libraries left out, and the libraries ``kimi_deploy.releases.host_libraries`` installs for the Mooncake
master and store client held to the published wheels (downloaded once with pip, cached as the
cluster's package index caches them)."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from kimi_deploy.releases.host_libraries import MOONCAKE_CLIENT, MOONCAKE_MASTER, PACKAGES, packages
from localcluster import pypi_mirror
from tests.host_converge import LOCK, host_converge, lock_stands_in
from tests.tool_module import load_tool

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parent.parent
TOOL = load_tool(Path(__file__).resolve().parent.parent / "tools/needed_libs.py")
NotElf, needed, wheel_needs = TOOL.NotElf, TOOL.needed, TOOL.wheel_needs
closure_needs, unaccounted = TOOL.closure_needs, TOOL.unaccounted


def _readelf(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def _compile(folder: Path, name: str, source: str, *libraries: str) -> Path:
    (folder / f"{name}.c").write_text(source, encoding="utf-8")
    out = folder / f"{name}.so"
    argv = [
        "gcc",
        "-shared",
        "-fPIC",
        "-o",
        str(out),
        str(folder / f"{name}.c"),
        f"-L{folder}",
        "-Wl,--no-as-needed",
        *libraries,
    ]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return out


def test_the_reader_finds_what_readelf_finds(tmp_path: Path) -> None:
    ours = _compile(tmp_path, "libours", "int ours(void) { return 1; }\n", "-lm", "-l:libcurl.so.4")
    files = [Path(sys.executable).resolve(), ours, Path("/usr/lib/x86_64-linux-gnu/libcurl.so.4").resolve()]
    for path in files:
        names = needed(path.read_bytes())
        assert names == _readelf(path), path
        assert names, path
    assert needed(ours.read_bytes()) == ["libm.so.6", "libcurl.so.4", "libc.so.6"]


def test_what_is_not_elf_is_said_so() -> None:
    for data in (b"#!/bin/sh\n", b"\x7fELF" + b"\x09" * 60, b""):
        with pytest.raises(NotElf):
            needed(data)


def test_a_wheel_needs_what_it_neither_carries_nor_may_expect(tmp_path: Path) -> None:
    """``ext.so`` links the wheel's own ``libours.so``, glibc's libm and libcurl: only libcurl is
    the host's to provide."""
    ours = _compile(tmp_path, "libours", "int ours(void) { return 1; }\n")
    ext = _compile(
        tmp_path, "ext", "int ours(void);\nint ext(void) { return ours(); }\n", "-lours", "-lm", "-l:libcurl.so.4"
    )
    wheel = tmp_path / "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(ext, "pkg/ext.so")
        z.write(ours, "pkg.libs/libours.so")
        z.writestr("pkg/__init__.py", "")
    assert wheel_needs(str(wheel)) == {"pkg/ext.so": ["libcurl.so.4"]}
    assert wheel_needs(str(wheel), ["pkg.libs/libours.so"]) == {}


def _wheel(requirement: str) -> str:
    folder, names = pypi_mirror.download([requirement])
    stem = requirement.split("==", maxsplit=1)[0].replace("-", "_")
    (name,) = [n for n in names if n.startswith(f"{stem}-")]
    return str(folder / name)


def test_the_mooncake_master_and_store_client_need_what_the_deploy_installs() -> None:
    master = wheel_needs(_wheel("mooncake-transfer-engine==0.3.13.post1"), ["mooncake/mooncake_master"])
    assert sorted(master["mooncake/mooncake_master"]) == sorted(MOONCAKE_MASTER)
    client = wheel_needs(_wheel("mooncake-transfer-engine-cuda13==0.3.13.post1"), ["mooncake/store.so"])
    # the driver's libcuda and the CUDA runtime wheel torch brings are not the host archive's
    assert sorted(client["mooncake/store.so"]) == sorted((*MOONCAKE_CLIENT, "libcuda.so.1", "libcudart.so.13"))


def test_each_library_maps_to_its_package_on_each_os() -> None:
    assert packages(MOONCAKE_MASTER, None) == ("libcurl4", "libibverbs1", "libnuma1")
    assert packages(MOONCAKE_MASTER, "ubuntu-24.04") == ("libcurl4t64", "libibverbs1", "libnuma1")
    assert packages(MOONCAKE_CLIENT, "debian-13")[:3] == ("libcurl4t64", "libibverbs1", "ibverbs-providers")
    assert all(set(by_os) == set(PACKAGES["libcurl.so.4"]) for by_os in PACKAGES.values())


def test_the_hosts_that_run_mooncake_get_its_libraries_in_their_oss_names(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gb300-pd (Ubuntu 24.04): the router host runs the master, every engine host the store client."""
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    router = host_converge(recipe, prod, "gb300-rt01").packages
    assert {"libcurl4t64", "libibverbs1", "libnuma1"} <= set(router)
    assert "ibverbs-providers" not in router
    engine = host_converge(recipe, prod, "gb300-d01").packages
    assert {"libcurl4t64", "libibverbs1", "ibverbs-providers", "libnuma1"} <= set(engine)
    # NIXL's core links OpenSSL 3 (NixlConnector, on the engine hosts only)
    assert "libssl3t64" in engine
    assert "libssl3t64" not in router
    # no Mooncake on single-node: none of its libraries
    assert not set(host_converge(recipe, prod, "b300-01").packages) & {"libcurl4t64", "libibverbs1"}
    # a recipe that names no OS: Debian 12's names
    assert "libcurl4" in host_converge(recipe.model_copy(update={"os": None}), prod, "gb300-rt01").packages


def test_a_closure_provides_what_any_of_its_wheels_carries_and_the_rest_is_accounted_for_or_said(
    tmp_path: Path,
) -> None:
    """Across a release's wheels: ``ext.so`` links ``libours.so`` that another wheel carries (the
    closure provides it) and libcurl, which nothing the deploy installs for ``pkg/`` accounts for;
    the same libcurl linked by the Mooncake client is installed with it, and numba's TBB layer
    (a plugin numba skips without TBB) needs nothing. ``--check`` says the one left, exit 1."""
    ours = _compile(tmp_path, "libours", "int ours(void) { return 1; }\n")
    ext = _compile(tmp_path, "ext", "int ours(void);\nint ext(void) { return ours(); }\n", "-lours", "-l:libcurl.so.4")
    closure = tmp_path / "closure"
    closure.mkdir()
    members = {
        "pkg-1.0-py3-none-manylinux_2_28_x86_64.whl": {"pkg/ext.so": ext},
        "ours-1.0-py3-none-manylinux_2_28_x86_64.whl": {"ours.libs/libours.so": ours},
        "mooncake_transfer_engine-1.0-py3-none-manylinux_2_28_x86_64.whl": {"mooncake/store.so": ext},
        "numba-1.0-py3-none-manylinux_2_28_x86_64.whl": {"numba/np/ufunc/tbbpool.so": ext},
    }
    for name, files in members.items():
        with zipfile.ZipFile(closure / name, "w") as z:
            for arcname, path in files.items():
                z.write(path, arcname)
    needs = closure_needs(sorted(closure.glob("*.whl")))
    assert set(needs) == {"libcurl.so.4"}
    assert unaccounted(needs) == {"libcurl.so.4": [("pkg-1.0-py3-none-manylinux_2_28_x86_64.whl", "pkg/ext.so")]}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools/needed_libs.py"), "--closure", str(closure), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (
        1,
        "libcurl.so.4: pkg-1.0-py3-none-manylinux_2_28_x86_64.whl (pkg/ext.so)\n",
    )
