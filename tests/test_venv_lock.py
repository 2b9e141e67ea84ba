"""Engine and tool releases installed from one lock: where each host's lock comes from (its own,
or the controller's for its platform, never another host's), that the platform a host reports is
checked before anything is resolved for it, what the host probe finds damaged in a release, and
the one line an install failure comes down to (uv's and pip's output as they print it, captured
against the local package index)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.request
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kimi_deploy.hostside import state_probe, uv_process, venv_install
from kimi_deploy.hostside.boundary_lock import lock_pins
from kimi_deploy.hostside.probe_types import Damage, ReleaseMarker
from kimi_deploy.releases.lock import HostPlatform, LockError
from kimi_deploy.releases.venv_lock import LockSource, damage_line, lock_source
from kimi_pyinfra.operations import engine
from kimi_pyinfra.run_context import RunContext

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

PATH = "/opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0"
REQS = ["vllm==0.34.0", "fastsafetensors==0.5.0"]
INDEX = "http://10.213.7.1:8766/simple"
HOLDS: ReleaseMarker = {"requirements": REQS, "lock": {"sha256": "a" * 64, "platform": "cp311-x86_64"}, "damaged": None}
DAMAGED: ReleaseMarker = {
    **HOLDS,
    "damaged": {"count": 1, "first": ["lib/python3.11/site-packages/vllm/__init__.py"], "lock_intact": True},
}
LOCK_GONE: ReleaseMarker = {
    **HOLDS,
    "damaged": {"count": 2, "first": [".kimi-lock.txt", "bin/vllm"], "lock_intact": False},
}


def test_a_host_holding_its_release_installs_nothing() -> None:
    assert lock_source(HOLDS) is None


def test_a_damaged_release_is_rebuilt_from_its_own_lock() -> None:
    assert lock_source(DAMAGED) == LockSource("own", "a" * 64)


def test_any_other_install_takes_the_controllers_lock_whatever_other_hosts_hold() -> None:
    # an older release's marker: no lock of its own to rebuild from, whatever the damage
    damage: Damage = {"count": 1, "first": ["bin/vllm"], "lock_intact": True}
    old: ReleaseMarker = {
        "package": "vllm",
        "version": "0.34.0",
        "requirements": REQS,
        "index_url": INDEX,
        "damaged": damage,
    }
    for marker in (None, LOCK_GONE, old):
        assert lock_source(marker) == LockSource("controller")


def test_lock_helpers() -> None:
    text = f"# platform: cp311-x86_64\nvllm==0.34.0 \\\n    --hash=sha256:{'91fb' * 16}\nFast_SafeTensors==0.5.0 \\\n"
    text += f"    --hash=sha256:{'1d06' * 16}\n"
    assert lock_pins(text) == {"vllm": "0.34.0", "fast-safetensors": "0.5.0"}
    assert damage_line(PATH, DAMAGED["damaged"]) == (  # type: ignore[arg-type]
        f"{PATH}: 1 file missing or changed since install (lib/python3.11/site-packages/vllm/__init__.py)"
    )


LOCK = (Path(__file__).resolve().parent / "fixtures/locks/vllm-0.34.0+fastsafetensors-0.5.0.txt").read_text()
EVIL = LOCK + "evil @ file:///tmp/evil-1.0.tar.gz\n"
RULE = "a lock holds only name==version lines, each with --hash=sha256:<64 hex>"
PLATFORM = {"python": "3.11", "machine": "x86_64", "libc": "glibc 2.36"}


def _install(
    monkeypatch: pytest.MonkeyPatch,
    lock: LockSource,
    resolved: list[tuple[Any, ...]],
    executing: bool = True,
    same_run: bool = False,
) -> list[str]:
    """The commands ``engine.venv`` yields for a new release on this host, the controller's
    resolutions recorded in ``resolved``; raises what the operation raises."""

    def cached_lock(
        requirements: list[str], without: list[str], index_url: str, platform: HostPlatform, environ: Any
    ) -> str:
        resolved.append((requirements, without, index_url, platform))
        return LOCK

    monkeypatch.setattr(engine, "cached_lock", cached_lock)
    if not same_run:
        _context(monkeypatch, executing)
    return list(
        engine.venv._inner(
            path=PATH,
            package="vllm",
            version="0.34.0",
            requirements=REQS,
            index_url=INDEX,
            current=None,
            lock=lock,
            platform=PLATFORM,
            uv="0.13.9",
            without=["torchvision"],
        )
    )


def _context(monkeypatch: pytest.MonkeyPatch, executing: bool = True) -> None:
    run = RunContext(run_id="20250101T000000Z-ab12", transfer_key="", environ={})
    monkeypatch.setattr(engine, "run_context", lambda: run)
    monkeypatch.setattr(engine, "state", SimpleNamespace(is_executing=executing))


def _fails(command: str) -> str:
    """What ``command`` prints on stderr, run as the host runs it; it must fail."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False, timeout=10)
    assert (done.returncode, done.stdout) == (1, "")
    return done.stderr


def _request(command: str) -> dict[str, Any]:
    return dict(json.loads(zlib.decompress(base64.b64decode(command.rsplit(" ", 1)[1]))))


def test_the_install_gets_the_lock_the_controller_resolved_for_the_hosts_platform(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[tuple[Any, ...]] = []
    (command,) = _install(monkeypatch, LockSource("controller"), resolved)
    assert _request(command)["lock"] == {"text": LOCK}
    platform = HostPlatform((3, 11), "x86_64", (2, 36))
    assert resolved == [(REQS, ["torchvision"], INDEX, platform)]
    # a second host of the platform in the run: the same lock, not resolved again
    (command,) = _install(monkeypatch, LockSource("controller"), resolved, same_run=True)
    assert (_request(command)["lock"], len(resolved)) == ({"text": LOCK}, 1)
    # pyinfra also runs the operation to detect changes: nothing is resolved then
    resolved.clear()
    (command,) = _install(monkeypatch, LockSource("controller"), resolved, executing=False)
    assert (_request(command)["lock"], resolved) == (None, [])


@pytest.mark.parametrize(
    ("found", "line"),
    [
        (None, "the host did not report its platform"),
        ({**PLATFORM, "machine": "x86_64\x1b[2J"}, "machine 'x86_64\\x1b[2J': expected one of x86_64, aarch64"),
        ({**PLATFORM, "python": "3.11; rm -rf /"}, "python '3.11; rm -rf /': expected a CPython 3.x version"),
        ({**PLATFORM, "libc": "musl 1.2"}, "C library 'musl 1.2': expected glibc 2.17 or newer"),
    ],
    ids=["none", "escape", "python", "musl"],
)
def test_a_platform_the_host_reports_is_checked_before_anything_is_resolved(
    monkeypatch: pytest.MonkeyPatch, found: Any, line: str
) -> None:
    monkeypatch.setattr(engine, "cached_lock", lambda *a: pytest.fail("resolved"))
    _context(monkeypatch)
    (command,) = engine.venv._inner(
        path=PATH,
        package="vllm",
        version="0.34.0",
        requirements=REQS,
        index_url=INDEX,
        current=None,
        lock=LockSource("controller"),
        platform=found,
        uv="0.13.9",
    )
    assert _fails(command) == f"kimi-deploy: {PATH}: {line}\n"


def test_a_release_that_does_not_resolve_fails_the_host_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> str:
        raise LockError(f"vllm==0.34.0 -> flashinfer-python==0.7.3 is not on {INDEX} (available: 0.7.4)")

    monkeypatch.setattr(engine, "cached_lock", refuse)
    _context(monkeypatch)
    (command,) = engine.venv._inner(
        path=PATH,
        package="vllm",
        version="0.34.0",
        requirements=REQS,
        index_url=INDEX,
        current=None,
        lock=LockSource("controller"),
        platform=PLATFORM,
        uv="0.13.9",
    )
    line = f"vllm==0.34.0 -> flashinfer-python==0.7.3 is not on {INDEX} (available: 0.7.4)"
    assert _fails(command) == f"kimi-deploy: {PATH}: {line}\n"


# uv 0.13.9 and pip 23.0.1 (Debian 12's ensurepip) against localcluster.pkgindex.
UV_MISSING = """error: No solution found when resolving dependencies
  cause: Because there is no version of fastsafetensors==0.5.1 and you require fastsafetensors==0.5.1, we can conclude that your requirements are unsatisfiable.
"""
UV_UNKNOWN = """error: No solution found when resolving dependencies
  cause: Because vllm was not found in the package registry and you require vllm==0.34.0, we can conclude that your requirements are unsatisfiable.
"""
UV_503 = """error: Request failed after 3 retries in 7.2s
  cause: Failed to fetch: http://10.213.7.1:8766/simple/fastsafetensors/
  cause: HTTP status server error (503 Service Unavailable) for url (http://10.213.7.1:8766/simple/fastsafetensors/)
"""
UV_REFUSED = """error: Request failed after 1 retry in 1.1s
  cause: Failed to fetch: http://10.213.7.1:8766/simple/fastsafetensors/
  cause: error sending request for url (http://10.213.7.1:8766/simple/fastsafetensors/)
  cause: client error (Connect)
  cause: tcp connect error
  cause: Connection refused (os error 111)
"""
UV_HASH = """Resolved 1 package in 2ms
error: Failed to download `vllm==0.34.0`
  cause: Hash mismatch for `vllm==0.34.0`

         Expected:
           sha256:0000000000000000000000000000000000000000000000000000000000000000
"""
UV_ZIP = """error: Failed to download `vllm==0.34.0`
  cause: Failed to extract archive: vllm-0.34.0-py3-none-any.whl
  cause: Invalid zip file structure
  cause: Encountered an unexpected header (actual: 0xfbfcb4af, expected: 0x4034b50).
"""
# uv 0.13.9 against the local index holding broken 1.0 (needs lib==3.0) and 1.1, and lib 1.0
UV_CHAIN = """error: No solution found when resolving dependencies
  cause: Because there is no version of lib==3.0 and broken<=1.0 depends on lib==3.0, we can conclude that broken<=1.0 cannot be used.
         And because you require broken==1.0, we can conclude that your requirements are unsatisfiable.
"""
PIP_NONE = """Looking in indexes: http://10.213.7.1:8766/simple
ERROR: Could not find a version that satisfies the requirement uv==0.13.7 (from versions: 0.13.9)
ERROR: No matching distribution found for uv==0.13.7
"""


@pytest.mark.parametrize(
    ("output", "listed", "line"),
    [
        (UV_MISSING, "0.5.0", f"fastsafetensors==0.5.1 is not on {INDEX} (available: 0.5.0)"),
        (UV_UNKNOWN, "none", f"vllm==0.34.0 is not on {INDEX} (available: none)"),
        (UV_503, "0.5.0", f"package index {INDEX} does not answer"),
        (UV_REFUSED, None, f"package index {INDEX} does not answer"),
        (UV_HASH, "0.34.0", f"vllm==0.34.0: {INDEX} serves other bytes than the lock's hash"),
        (
            UV_ZIP,
            "0.34.0",
            "Failed to download `vllm==0.34.0`: Encountered an unexpected header (actual: 0xfbfcb4af, expected: 0x4034b50).",
        ),
        (PIP_NONE, "0.13.9", f"uv==0.13.7 is not on {INDEX} (available: 0.13.9)"),
        (UV_CHAIN, "1.0", f"broken==1.0 -> lib==3.0 is not on {INDEX} (available: 1.0)"),
        # pip reads a 503 as "no versions": the index is asked, and does not answer.
        (PIP_NONE, None, f"package index {INDEX} does not answer"),
    ],
)
def test_an_install_failure_is_one_line(
    monkeypatch: pytest.MonkeyPatch, output: str, listed: str | None, line: str
) -> None:
    monkeypatch.setattr(uv_process, "_available", lambda index, project: listed)
    assert uv_process.reason(output, INDEX) == line


def test_available_versions_are_read_from_the_index_page(monkeypatch: pytest.MonkeyPatch) -> None:
    page = (
        '<a href="/files/fastsafetensors-0.5.0-py3-none-any.whl#sha256=1d06">x</a>'
        '<a href="https://files.example/vllm-router-0.1.17.tar.gz#sha256=ab">y</a>'
        '<a href="fastsafetensors-0.4.2-cp311-cp311-manylinux_2_17_x86_64.whl">z</a>'
    )

    class Page:
        def __enter__(self) -> Page:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self, limit: int = -1) -> bytes:
            return page.encode()[:limit] if limit >= 0 else page.encode()

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: Page())
    assert uv_process._available(INDEX, "fastsafetensors") == "0.5.0, 0.4.2"
    assert uv_process._available(INDEX, "vllm-router") == "0.1.17"


def _release(tmp_path: Path) -> Path:
    """A release folder as the install leaves it: files, a link, its manifest and marker."""
    root = tmp_path / "vllm-0.34.0"
    (root / "lib/python3.11/site-packages/vllm").mkdir(parents=True)
    (root / "lib/python3.11/site-packages/vllm/__init__.py").write_text('__version__ = "0.34.0"\n')
    (root / "lib64").symlink_to("lib")
    (root / "bin").mkdir()
    (root / "bin/python").symlink_to("/usr/bin/python3")
    (root / venv_install.LOCK).write_text("vllm==0.34.0\n")
    manifest = venv_install._manifest(str(root))
    (root / venv_install.MANIFEST).write_text(json.dumps({"files": manifest}))
    marker = {"requirements": ["vllm==0.34.0"], "lock": {"sha256": "a" * 64}, "manifest": venv_install.MANIFEST}
    (root / venv_install.MARKER).write_text(json.dumps(marker))
    return root


def test_the_manifest_holds_every_file_and_link_with_its_size(tmp_path: Path) -> None:
    root = _release(tmp_path)
    assert venv_install._manifest(str(root)) == {
        ".kimi-lock.txt": 13,
        "bin/python": len("/usr/bin/python3"),
        "lib/python3.11/site-packages/vllm/__init__.py": 23,
        "lib64": 3,
    }


def _whole(marker: ReleaseMarker | None) -> ReleaseMarker:
    assert marker is not None, "the release has a marker"
    return marker


def test_the_probe_finds_a_release_whole(tmp_path: Path) -> None:
    found = _whole(state_probe._marker(str(_release(tmp_path))))
    assert found["damaged"] is None
    assert found["lock"] == {"sha256": "a" * 64}


def test_the_probe_finds_a_deleted_or_truncated_file(tmp_path: Path) -> None:
    root = _release(tmp_path)
    os.remove(root / "lib/python3.11/site-packages/vllm/__init__.py")
    (root / ".kimi-lock.txt").write_text("")
    assert _whole(state_probe._marker(str(root)))["damaged"] == {
        "count": 2,
        "first": [".kimi-lock.txt", "lib/python3.11/site-packages/vllm/__init__.py"],
        "lock_intact": False,
    }


def test_the_probe_reads_a_release_without_its_manifest_as_damaged(tmp_path: Path) -> None:
    root = _release(tmp_path)
    os.remove(root / venv_install.MANIFEST)
    assert _whole(state_probe._marker(str(root)))["damaged"] == {
        "count": 1,
        "first": [venv_install.MANIFEST],
        "lock_intact": False,
    }


def test_the_probe_reads_an_older_marker_as_it_is_and_no_marker_as_absent(tmp_path: Path) -> None:
    root = _release(tmp_path)
    old = {"package": "vllm", "requirements": ["vllm==0.34.0"]}
    (root / venv_install.MARKER).write_text(json.dumps(old))
    assert state_probe._marker(str(root)) == old
    os.remove(root / venv_install.MARKER)
    assert state_probe._marker(str(root)) is None
