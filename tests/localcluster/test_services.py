"""The cluster's services across ``cluster up`` runs: one started from what this checkout builds is
kept, one started by other code (a newer kimi-deploy: another model commit, another pinned
release) is rebuilt and restarted, so that it never serves what an older checkout built."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from localcluster import services
from localcluster.services import Service
from localcluster.state import ServiceRecord, Settings
from localcluster.static_files import PUBLIC

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

# What the service's ``prepare`` writes: a file name and its text, as a checkout's build would.
CONTENT: dict[str, str] = {}


def prepare(root: Path) -> None:
    """The service's build: writes what CONTENT names, leaving what is there (as every prepare does)."""
    for name, text in CONTENT.items():
        (root / PUBLIC).mkdir(parents=True, exist_ok=True)
        (root / PUBLIC / name).write_text(text, encoding="utf-8")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_service_is_kept_while_its_code_stays_and_rebuilt_and_restarted_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env(
        {"KIMI_CLUSTER_DIR": str(tmp_path / "cluster"), "KIMI_CLUSTER_SUBNET": "127.0.77.0/24"}
    )
    with socket.socket() as probe:
        probe.bind((settings.gateway, 0))
        port = probe.getsockname()[1]
    service = Service("files", "localcluster.static_files", port, prepare=f"{__name__}:prepare")
    monkeypatch.setattr(services, "SERVICES", (service,))
    # The checkout the content is built from: one source file here, which the test changes.
    source = tmp_path / "checkout" / "localcluster"
    source.mkdir(parents=True)
    (source / "content.py").write_text("FORMAT = 1\n", encoding="utf-8")
    monkeypatch.setattr(services, "INPUTS", ((source, ("*.py",)),))
    settings.logs_dir.mkdir(parents=True, exist_ok=True)
    CONTENT.clear()
    CONTENT["v1.txt"] = "one"
    recorded: dict[str, ServiceRecord] = {}
    try:
        services.ensure(settings, recorded)
        first = recorded["files"]
        base = f"http://{settings.gateway}:{port}"
        assert _get(f"{base}/v1.txt") == 200
        CONTENT["v2.txt"] = "two"
        services.ensure(settings, recorded)  # the same code: the same process, nothing rebuilt
        assert recorded["files"] == first
        assert _get(f"{base}/v2.txt") == 404
        # what a newer checkout builds, from changed code
        (source / "content.py").write_text("FORMAT = 2\n", encoding="utf-8")
        services.ensure(settings, recorded)
        second = recorded["files"]
        assert second.pid != first.pid
        assert second.content != first.content
        assert not services.is_running(settings, service, first.pid)
        assert _get(f"{base}/v2.txt") == 200
    finally:
        services.stop(settings, recorded)
        CONTENT.clear()
