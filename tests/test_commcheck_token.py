"""The communication check's token: no local user of a host learns it (not from a process's argv,
not from a listener's hello), so none can forge a report that makes a failing check pass."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pyinfra.api.command import StringCommand

from kimi_deploy.hostside.commcheck import TOKEN_CREDENTIAL
from kimi_deploy.hostside.requests import CommCheckRequest
from kimi_pyinfra.operations import commcheck
from tests.test_commcheck import HELLO_BYTES, TOKEN, topology
from tests.test_commcheck_phases import _command, _step, listeners

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _request_in(argv: list[str]) -> dict[str, Any]:
    """The request a host program's argv carries (its last word), as any local user decodes it."""
    word = next(w for w in reversed(argv) if w)
    found: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(word)))
    return found


def _forge(source: str, address: str, port: int, message: dict[str, Any]) -> None:
    """What a local user of a host can send to a peer's listener, from that host's address,
    with whatever the listener's hello told it."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(2)
        sock.connect((address, port))
        hello = json.loads(sock.recv(HELLO_BYTES).split(b"\n", 1)[0])
        said = {k: v for k, v in hello.items() if k not in ("kimi_commcheck", "host", "ephemeral")}
        sock.sendall((json.dumps({**said, **message}) + "\n").encode())
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            sock.recv(100)


def test_a_local_user_cannot_forge_the_report_of_a_host_that_never_probed() -> None:
    topo = topology(2, deadline=2.0)
    h1, h2 = topo.requests
    with listeners(topo.requests) as procs:
        for proc in procs:
            assert TOKEN not in "".join(_argv(proc.pid))
        # A local user of kimi-h1 reads its listener's argv, as /proc lets every user...
        seen = _request_in(_argv(procs[0].pid))
        # ...while kimi-h1's own probe step never runs; kimi-h2's does.
        assert _step(h2, "probe")[0] == 0
        forged = {"op": "report", "run": seen["run"], "from": "kimi-h1", "ok": True, "failures": []}
        _forge(h1["address"], h2["address"], topo.check, forged)
        rc, result, err = _step(h2, "verdict")
    assert rc == 1, result
    assert f"kimi-deploy: comm check: kimi-h1 did not report (it is up; can it reach kimi-h2:{topo.check}?)" in err


def test_a_local_user_cannot_forge_what_its_own_hosts_probe_found() -> None:
    topo = topology(2, deadline=2.0)
    h1, _ = topo.requests
    with listeners(topo.requests) as procs:
        seen = _request_in(_argv(procs[0].pid))
        # kimi-h1's probe never runs; a local user of kimi-h1 says it found nothing wrong.
        probed = {
            "op": "probed",
            "run": seen["run"],
            "from": "kimi-h1",
            "pairs": [],
            "failures": [],
            "delivered": {"kimi-h2": None},
        }
        _forge(h1["address"], h1["address"], topo.check, probed)
        rc, result, err = _step(h1, "verdict")
    assert rc == 1, result
    assert "kimi-h1: its probe step did not run" in err


def test_the_steps_carry_the_token_on_standard_input_never_in_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = topology(2)
    # the host program's own test topology (tests/test_commcheck.py): a request as the program reads it
    request = cast(CommCheckRequest, topo.requests[0])
    token = "c2VjcmV0LXRva2VuLW9mLXRoZS1jaGVjaw"
    monkeypatch.setattr(commcheck, "host", SimpleNamespace(noop=lambda _: None))
    steps = [commcheck.listening, commcheck.probed, commcheck.passed]
    commands = [c for step in steps for c in step._inner(request=request, token=token)]
    texts = [str(c) for c in commands]
    assert all(token not in text for text in texts), texts
    given = [c.connector_arguments.get("_stdin") for c in commands if isinstance(c, StringCommand)]
    # the listener's token file (filled from standard input), then the probe and the verdict
    assert given == [token, token, token]
    listen = next(t for t in texts if "systemd-run" in t)
    assert f"LoadCredential={TOKEN_CREDENTIAL}:{commcheck.TOKEN_FILE}" in listen
    assert any(f"rm -f {commcheck.TOKEN_FILE}" in t for t in texts)


def test_a_step_without_its_token_is_a_bad_request() -> None:
    topo = topology(2, deadline=1.0)
    run = subprocess.run(
        ["sh", "-c", _command(topo.requests[0], "probe")],
        input="",
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr == "kimi-deploy: comm check: bad request: no token on standard input\n"
