"""Engine and tool releases installed from one lock: where each host's lock comes from, that a
lock read from another host is refused before it goes anywhere unless it is hashed pins of the
recipe's versions, what the host probe finds damaged in a release, and the one line an install
failure comes down to (uv's and pip's output as they print it, captured against the local package
index)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.request
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from facts.engine import LockFile
from hostside import state_probe, venv_install
from hostside.boundary_lock import lock_pins
from hostside.probe_types import ReleaseMarker
from kimi_deploy.venv_lock import LockSource, damage_line, lock_source, staged_lock
from kimi_pyinfra.run_context import RunContext
from operations import engine

PATH = "/opt/kimi/engines/vllm-0.34.0+fastsafetensors-0.5.0"
REQS = ["vllm==0.34.0", "fastsafetensors==0.5.0"]
INDEX = "http://10.213.7.1:8766/simple"
HOLDS = {"requirements": REQS, "lock": {"sha256": "a" * 64, "platform": "cp311-x86_64"}, "damaged": None}
DAMAGED = {**HOLDS, "damaged": {"count": 1, "first": ["lib/python3.11/site-packages/vllm/__init__.py"],
                                "lock_intact": True}}  # fmt: skip
LOCK_GONE = {**HOLDS, "damaged": {"count": 2, "first": [".kimi-lock.txt", "bin/vllm"], "lock_intact": False}}


def probes(**venvs: Any) -> dict[str, Any]:
    return {name: {"venvs": {PATH: marker}} for name, marker in venvs.items()}


ORDER = ["h1", "h2", "h3", "h4"]


def test_a_host_holding_its_release_installs_nothing() -> None:
    assert lock_source("h1", PATH, REQS, probes(h1=HOLDS, h2=None), ORDER) is None


def test_a_damaged_release_is_rebuilt_from_its_own_lock() -> None:
    assert lock_source("h2", PATH, REQS, probes(h1=HOLDS, h2=DAMAGED), ORDER) == LockSource("own", "h2", "a" * 64)


def test_a_new_host_installs_the_lock_a_host_of_the_run_holds() -> None:
    found = probes(h1=None, h2=LOCK_GONE, h3=HOLDS, h4=HOLDS)
    for name in ("h1", "h2"):
        assert lock_source(name, PATH, REQS, found, ORDER) == LockSource("peer", "h3", "a" * 64)


def test_when_several_hosts_install_and_none_holds_it_the_first_resolves_for_all() -> None:
    found = probes(h2=None, h3=LOCK_GONE, h4=None)
    found["h1"] = OSError("unreachable")
    for name in ("h2", "h3", "h4"):
        assert lock_source(name, PATH, REQS, found, ORDER) == LockSource("resolver", "h2")


def test_a_host_installing_alone_resolves_while_installing() -> None:
    # h2 and h3 do not have this release in their plan (another engine): they take no part.
    found = probes(h1=None) | {"h2": {"venvs": {}}, "h3": {"venvs": {}}}
    assert lock_source("h1", PATH, REQS, found, ORDER) == LockSource("here")


def test_a_release_installed_by_an_older_deploy_has_no_lock_to_share() -> None:
    old = {"package": "vllm", "version": "0.34.0", "requirements": REQS, "index_url": INDEX}
    assert lock_source("h2", PATH, REQS, probes(h1=old, h2=None), ORDER) == LockSource("here")


def test_a_host_with_other_pins_is_no_source() -> None:
    other = {**HOLDS, "requirements": ["vllm==0.34.0"]}
    assert lock_source("h2", PATH, REQS, probes(h1=other, h2=None), ORDER) == LockSource("here")


def test_lock_helpers() -> None:
    text = f"# platform: cp311-x86_64\nvllm==0.34.0 \\\n    --hash=sha256:{'91fb' * 16}\nFast_SafeTensors==0.5.0 \\\n"
    text += f"    --hash=sha256:{'1d06' * 16}\n"
    assert lock_pins(text) == {"vllm": "0.34.0", "fast-safetensors": "0.5.0"}
    assert staged_lock(PATH, "20250101T000000Z-ab12") == (
        "/var/lib/kimi/locks/vllm-0.34.0+fastsafetensors-0.5.0@20250101T000000Z-ab12.txt"
    )
    assert damage_line(PATH, DAMAGED["damaged"]) == (  # type: ignore[arg-type]
        f"{PATH}: 1 file missing or changed since install (lib/python3.11/site-packages/vllm/__init__.py)"
    )


LOCK = (Path(__file__).resolve().parent / "fixtures/locks/vllm-0.34.0+fastsafetensors-0.5.0.txt").read_text()
EVIL = LOCK + "evil @ file:///tmp/evil-1.0.tar.gz\n"
UNHASHED = "".join(LOCK.splitlines(keepends=True)[:2]) + "fastsafetensors==0.5.0\nvllm==0.34.0\n"
RULE = "a lock holds only name==version lines, each with --hash=sha256:<64 hex>"


def _install(monkeypatch: pytest.MonkeyPatch, lock: LockSource, texts: dict[tuple[str, str], str]) -> list[str]:
    """The commands ``engine.venv`` yields for a new release on this host, with ``texts`` as the
    lock files other hosts hold; raises what the operation raises."""
    monkeypatch.setattr(engine, "_lock_of", lambda name, file: texts.get((name, file)))
    run = RunContext(run_id="20250101T000000Z-ab12", transfer_key="", environ={})
    monkeypatch.setattr(engine, "run_context", lambda: run)
    monkeypatch.setattr(engine, "state", SimpleNamespace(is_executing=True))
    return list(
        engine.venv._inner(
            path=PATH, package="vllm", version="0.34.0", requirements=REQS, index_url=INDEX, current=None,
            lock=lock, uv="0.13.9",
        )
    )  # fmt: skip


def _peer(text: str) -> LockSource:
    return LockSource("peer", "h3", hashlib.sha256(text.encode()).hexdigest())


def test_a_lock_read_from_a_peer_goes_to_the_install_as_read(monkeypatch: pytest.MonkeyPatch) -> None:
    (command,) = _install(monkeypatch, _peer(LOCK), {("h3", f"{PATH}/.kimi-lock.txt"): LOCK})
    request = json.loads(zlib.decompress(base64.b64decode(command.rsplit(" ", 1)[1])))
    assert request["lock"] == {"text": LOCK}


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        (EVIL, f"line 7: 'evil @ file:///tmp/evil-1.0.tar.gz': a direct reference (URL or path): {RULE}"),
        (LOCK + "-e /tmp/evil\n", f"line 7: '-e /tmp/evil': an option: {RULE}"),
        (
            "--index-url http://evil.example/simple\n" + LOCK,
            f"line 1: '--index-url http://evil.example/simple': an option: {RULE}",
        ),
        (UNHASHED, f"line 3: fastsafetensors==0.5.0 carries no --hash=sha256: {RULE}"),
        (LOCK.replace("vllm==0.34.0", "vllm==0.34.1"), "the lock pins vllm==0.34.1, the recipe vllm==0.34.0"),
    ],
    ids=["direct reference", "editable", "another index", "no hashes", "other versions"],
)
def test_a_bad_lock_read_from_a_peer_fails_the_host_naming_the_peer(
    monkeypatch: pytest.MonkeyPatch, text: str, rule: str
) -> None:
    with pytest.raises(OperationError) as refused:
        _install(monkeypatch, _peer(text), {("h3", f"{PATH}/.kimi-lock.txt"): text})
    assert str(refused.value) == f"{PATH}: the lock read from h3 is refused: {rule}"


def test_a_bad_lock_a_resolver_staged_fails_the_host_naming_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    staged = staged_lock(PATH, "20250101T000000Z-ab12")
    with pytest.raises(OperationError) as refused:
        _install(monkeypatch, LockSource("resolver", "h2"), {("h2", staged): EVIL})
    assert str(refused.value) == (
        f"{PATH}: the lock read from h2 is refused: line 7: 'evil @ file:///tmp/evil-1.0.tar.gz': "
        f"a direct reference (URL or path): {RULE}"
    )


def test_lock_file_fact_returns_the_exact_text() -> None:
    text = "vllm==0.34.0 \\\n    --hash=sha256:91fb\n"
    assert LockFile().process([base64.b64encode(text.encode()).decode()]) == text
    assert LockFile().process([]) is None
    assert "base64 -w0 '/opt/kimi/a b'" in LockFile().command("/opt/kimi/a b")


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
        # pip reads a 503 as "no versions": the index is asked, and does not answer.
        (PIP_NONE, None, f"package index {INDEX} does not answer"),
    ],
)
def test_an_install_failure_is_one_line(
    monkeypatch: pytest.MonkeyPatch, output: str, listed: str | None, line: str
) -> None:
    monkeypatch.setattr(venv_install, "_available", lambda index, project: listed)
    assert venv_install._reason(output, INDEX) == line


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
    assert venv_install._available(INDEX, "fastsafetensors") == "0.5.0, 0.4.2"
    assert venv_install._available(INDEX, "vllm-router") == "0.1.17"


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
