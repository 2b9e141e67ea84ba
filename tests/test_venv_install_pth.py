"""Installing a release runs none of its Python: a wheel a lock adds, whatever it carries, runs
only when the release itself is started, never as the root that installs it.

A ``.pth`` file in site-packages is executed by every interpreter that starts with that
site-packages (``site``). The attack: a lock given by another host pins, beside the recipe's
package, an extra hashed wheel that carries such a file. The real uv of the demo recipe installs
it (bootstrapped by the host program itself from a local PEP 503 index, as on a host: the uv
wheel comes from the cache the local test cluster fills, ``localcluster.pypi_mirror``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.boundary_lock import freeze_pins
from kimi_deploy.recipe_file import load_recipe
from localcluster import pkgindex, pypi_mirror
from tests.bundled import bundled_program
from tests.wheel_file import pure_wheel

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


def _pin(wheel: Path, name: str, version: str) -> str:
    return f"{name}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A local index holding the recipe's uv, a good wheel and one whose ``.pth`` writes a marker."""
    uv_version = str(load_recipe(pypi_mirror.DEMO_RECIPE).tools.uv)
    try:
        cache, names = pypi_mirror.download([f"uv=={uv_version}"])
    except RuntimeError as exc:
        pytest.skip(f"the uv wheel is not cached and cannot be downloaded: {exc}")
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    for name in names:
        shutil.copy(cache / name, files / name)
    marker = root / "pth-ran.txt"
    # One line of a .pth that starts with "import" is executed by site at every interpreter start.
    pth = f"import os; open({str(marker)!r}, 'a').write(str(os.getuid()) + chr(10))\n".encode()
    good = pure_wheel(files, "kimi_good", "1.0", {})
    evil = pure_wheel(files, "kimi_evil", "1.0", {"kimi_evil.pth": pth})
    here = f"cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}"
    server = pkgindex.serve(root)
    try:
        lock = f"# platform: {here}\n# index: {server.url}\n"
        lock += _pin(evil, "kimi-evil", "1.0") + _pin(good, "kimi-good", "1.0")
        yield {"url": server.url, "uv": uv_version, "lock": lock, "marker": marker}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def uv_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the host program bootstraps uv: once for the module, as once per host."""
    return tmp_path_factory.mktemp("uv") / "uv"


def _install(
    tmp_path: Path, index: dict[str, Any], uv_dir: Path, path: Path, env: dict[str, str]
) -> tuple[int, dict[str, Any], str]:
    request = {
        "path": str(path),
        "requirements": ["kimi-good==1.0"],
        "index_url": index["url"],
        "marker": {"package": "kimi-good", "version": "1.0", "requirements": ["kimi-good==1.0"]},
        "uv": {"version": index["uv"], "dir": str(uv_dir)},
        "lock": {"text": index["lock"]},
    }
    packed = base64.b64encode(zlib.compress(json.dumps(request).encode())).decode()
    program = bundled_program("venv_install.py", tmp_path)
    done = subprocess.run(
        [sys.executable, str(program), packed],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        env={**os.environ, **env},
    )
    return done.returncode, json.loads(done.stdout.splitlines()[-1]), done.stderr


# uv's own setting in the installing root's environment: it asks uv to compile bytecode.
@pytest.mark.parametrize("env", [{}, {"UV_COMPILE_BYTECODE": "1"}], ids=["plain", "uv-compile-bytecode-set"])
def test_a_pth_file_in_a_locked_wheel_does_not_run_while_the_release_installs(
    tmp_path: Path, index: dict[str, Any], uv_dir: Path, env: dict[str, str]
) -> None:
    marker: Path = index["marker"]
    marker.unlink(missing_ok=True)
    path = tmp_path / "tools/kimi_good-1.0"
    code, answer, stderr = _install(tmp_path, index, uv_dir, path, env)
    assert (code, answer.get("ok"), answer.get("packages")) == (0, True, 2), stderr
    assert not marker.exists(), f"the release's .pth ran during the install, as uid {marker.read_text().split()}"

    # The install is complete and verified: both pins, as the lock has them, with their bytecode.
    assert freeze_pins((path / ".kimi-freeze.txt").read_text()) == {"kimi-evil": "1.0", "kimi-good": "1.0"}
    assert (path / ".kimi-lock.txt").read_text() == index["lock"]
    assert json.loads((path / ".kimi-release.json").read_text())["lock"]["packages"] == 2
    assert list((path / SITE / "kimi_good/__pycache__").glob("__init__.*.pyc"))
    assert (path / SITE / "kimi_evil.pth").is_file()

    # The wheel does what it says once the release's interpreter starts: the test above means something.
    subprocess.run([str(path / "bin/python"), "-c", "pass"], check=True, timeout=30)
    assert marker.exists()
