"""A gated repository, run locally: the real huggingface_hub client inside ``hostside/weights_sync.py``
against the fake Hub answering as the Hub does for a gated repository (``"gated"`` in its faults).
Without a token, and with a token whose account was not granted access, the sync fails in one line
naming the repository, why and what to do; with a granted token it proceeds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_deploy.hostside.hub_access import gated_line, token_line
from localcluster.hub import HubServer, serve, write_faults
from tests.test_weights_hub_relay import COMMIT, REPO, _write_repo
from tests.test_weights_peer import key_file
from tests.test_weights_relay import _sync_proc

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

__all__ = ["key_file"]  # the fixture, shared

GRANTED = "hf_granted_0a1b2c3d4e5f"


@pytest.fixture
def gated_hub(tmp_path: Path) -> Iterator[tuple[HubServer, dict[str, list[Any]]]]:
    lock = _write_repo(tmp_path / "hub")
    write_faults(tmp_path / "hub", {"gated": {REPO: [GRANTED]}})
    server = serve(tmp_path / "hub", "127.0.0.1", 0, log_stream=None)
    try:
        yield server, lock
    finally:
        server.stop()


def _sync(tmp_path: Path, key: Path, hub: HubServer, lock: dict[str, list[Any]], token: str | None) -> tuple[int, str]:
    token_file = None
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(token, encoding="utf-8")
        token_file.chmod(0o600)
    root = tmp_path / "revision"
    proc = _sync_proc(
        root,
        lock,
        [],
        key,
        repo=REPO,
        revision=COMMIT,
        endpoint=hub.url,
        token_file=str(token_file) if token_file else None,
        retries=1,
    )
    _, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("kimi-deploy: ")]
    return proc.returncode, lines[-1] if lines else err


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("hf_not_granted_99", 403)])
def test_a_gated_repository_refuses_in_one_line(
    tmp_path: Path, key_file: Path, gated_hub: tuple[HubServer, dict[str, list[Any]]], token: str | None, status: int
) -> None:
    hub, lock = gated_hub
    code, line = _sync(tmp_path, key_file, hub, lock, token)
    assert (code, line) == (
        5,
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {hub.url}: {gated_line(REPO, hub.url, status)}",
    )
    assert "is gated and " + ("no token was sent" if status == 401 else "the token's account has not been") in line
    assert not any((tmp_path / "revision").glob("*.safetensors"))


def test_a_granted_token_proceeds(
    tmp_path: Path, key_file: Path, gated_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    hub, lock = gated_hub
    code, said = _sync(tmp_path, key_file, hub, lock, GRANTED)
    assert code == 0, said
    assert sorted(p.name for p in (tmp_path / "revision").iterdir() if not p.name.startswith(".")) == sorted(lock)
    stats = hub.stats.snapshot()
    assert stats["downloads"]["w.safetensors"] == 1  # from the Hub's CDN, another origin...
    assert stats["cdn_authorized"] == 0  # ...which the token never reached


def test_a_token_the_hub_no_longer_takes_is_named_before_a_file_is_asked_for(
    tmp_path: Path, key_file: Path, gated_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    hub, lock = gated_hub
    write_faults(tmp_path / "hub", {"gated": {REPO: [GRANTED]}, "revoked": [GRANTED]})
    code, line = _sync(tmp_path, key_file, hub, lock, GRANTED)
    assert (code, line) == (
        5,
        f"kimi-deploy: weights {REPO}@{COMMIT[:12]}: {hub.url}: {token_line(hub.url, str(tmp_path / 'token'))}",
    )
    assert "it has expired or was revoked: make a new one at " in line
    stats = hub.stats.snapshot()
    assert stats["requests"] == {"GET whoami": 1}  # one question, no file asked for


def test_a_token_revoked_during_the_sync_stops_it_in_the_same_line(
    tmp_path: Path, key_file: Path, gated_hub: tuple[HubServer, dict[str, list[Any]]]
) -> None:
    """Revoked after the sync has asked whose it is: its next file is refused, and said so."""
    hub, lock = gated_hub
    # The Hub takes the token for whoami, then answers a file as it answers a revoked token.
    write_faults(
        tmp_path / "hub",
        {"gated": {REPO: [GRANTED]}, "fail": [{"path": "w.safetensors", "method": "HEAD", "status": 401, "times": 1}]},
    )
    code, line = _sync(tmp_path, key_file, hub, lock, GRANTED)
    assert code == 5
    assert line.endswith(token_line(hub.url, str(tmp_path / "token")))
