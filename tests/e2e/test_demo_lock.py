"""`kimi-deploy lock` against the demo cluster's Hub reproduces the committed lock files exactly."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.own_cluster import BIN, ROOT
from tests.e2e.demo import state

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="the demo cluster needs root and iproute2"
)


@pytest.fixture(autouse=True, scope="module")
def _cluster(demo_cluster: None) -> None:
    """Needs the demo cluster's Hub and hosts."""


REVISIONS = ["23eb01d77aab1f1b9ff6dda80033b783970fe79c", "1088b4b0a968514a4de7da23014f7058bbfbd30c"]


def _lock(tmp_path: Path, revision: str) -> subprocess.CompletedProcess[str]:
    """`kimi-deploy lock` of the demo recipe pinned to ``revision``, run in ``tmp_path``."""
    (tmp_path / "recipes").mkdir()
    text = (ROOT / "recipes/demo-gpu.yaml").read_text(encoding="utf-8").replace(REVISIONS[0], revision)
    (tmp_path / "recipes/demo-gpu.yaml").write_text(text, encoding="utf-8")
    hub = state()["services"]["hub"]["url"]
    return subprocess.run(
        [str(BIN / "kimi-deploy"), "lock", "recipes/demo-gpu.yaml", "--endpoint", hub],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("revision", REVISIONS)
def test_lock_reproduces_the_committed_lock(tmp_path: Path, revision: str) -> None:
    run = _lock(tmp_path, revision)
    assert run.returncode == 0, run.stderr
    name = f"recipes/locks/moonshotai--Kimi-K3.1-Pro-Tiny@{revision}.json"
    assert run.stdout.startswith(f"{name}: 103 files, ")
    assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes()


def test_lock_of_an_unknown_revision_is_one_line(tmp_path: Path) -> None:
    run = _lock(tmp_path, "f" * 40)
    hub = state()["services"]["hub"]["url"]
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"recipes/demo-gpu.yaml: model: {hub}: moonshotai/Kimi-K3.1-Pro-Tiny@{'f' * 40}: ")
