"""How the converge runs a host program from a FunctionCommand (``operations.serving``): with the
operation's own connector arguments, as pyinfra runs a shell command the operation yields (a
converge with ``_sudo`` runs its smoke tests and drains with sudo), its success said in one line,
its failure in the program's own lines."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pyinfra.context import ctx_host

from kimi_deploy.hostside.requests import DrainRequest, SmokePlan
from kimi_pyinfra.operations import serving

CHECK: SmokePlan = {
    "unit": "kimi-vllm",
    "url": "http://127.0.0.1:8000",
    "request": {
        "served_name": "kimi-local",
        "prompt": "Reply with exactly the word READY and nothing else.",
        "expect": "READY",
        "timeout_s": 600,
        "max_tokens": 64,
        "key_file": None,
        "key_var": None,
    },
    "restarted": True,
    "restarts": 0,
    "only": None,
}


class _Host:
    """What the FunctionCommand reads of pyinfra's host: the running operation's arguments, its
    shell and its log."""

    name = "kimi-h1"

    def __init__(self, ok: bool, stdout: list[str], stderr: list[str]) -> None:
        self.current_op_global_arguments = {"_sudo": True, "_sudo_user": "root", "_ignore_errors": False}
        self.answer = (ok, SimpleNamespace(stdout_lines=stdout, stderr_lines=stderr))
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.said: list[str] = []

    def run_shell_command(self, command: str, **kwargs: Any) -> tuple[bool, Any]:
        self.calls.append((command, kwargs))
        return self.answer

    def log_styled(self, text: str, **_: Any) -> None:
        self.said.append(text)


def _run(host: _Host, check: SmokePlan, print_output: bool = False) -> bool:
    with ctx_host.use(host):
        command = serving._smoke(check)
    done: bool = command.function(SimpleNamespace(print_output=print_output), host)
    return done


def test_a_smoke_test_runs_with_the_operations_sudo_and_says_the_time_without_service() -> None:
    host = _Host(True, ['{"ok": true, "down_s": 41.2}'], [])
    assert _run(host, CHECK)
    ((command, kwargs),) = host.calls
    assert "smoke.py" in command
    assert (kwargs["_sudo"], kwargs["_sudo_user"], kwargs["print_output"]) == (True, "root", False)
    assert "_ignore_errors" not in kwargs  # not a connector argument: pyinfra keeps it to itself
    assert host.said == ["kimi-vllm answers again, 41 s after it stopped (the other instances served)"]
    only = _Host(True, ['{"ok": true, "down_s": 398.0}'], [])
    assert _run(only, CHECK | {"only": "single-node/serve"})
    assert only.said == ["single-node/serve: the only instance was without service for 398 s (kimi-vllm answers again)"]
    first = _Host(True, ['{"ok": true, "down_s": null}'], [])
    assert _run(first, CHECK)
    assert first.said == ["kimi-vllm answers its smoke test"]


def test_a_failed_smoke_test_says_the_programs_own_lines_once() -> None:
    lines = ["kimi-deploy: kimi-vllm: not ready after 600 s; journal tail:", "    (APIServer pid=1) ERROR ..."]
    host = _Host(False, ['{"ok": false}'], lines)
    assert not _run(host, CHECK)
    assert host.said == lines
    # with -v pyinfra printed them as they came: not again
    again = _Host(False, ['{"ok": false}'], lines)
    assert not _run(again, CHECK, print_output=True)
    assert again.said == []


def test_a_drain_runs_with_the_operations_sudo_and_its_own_bound() -> None:
    host = _Host(True, ['{"ok": true, "drained_s": {"http://10.0.0.11:8000": 0.6}}'], [])
    request: DrainRequest = {
        "router": "vllm-router",
        "api": "http://127.0.0.1:8009",
        "phase": "out",
        "workers": [],
        "timeout_s": 120,
    }
    with ctx_host.use(host):
        command = serving._drain(request, "out")
    assert command.function(SimpleNamespace(print_output=False), host)
    ((_, kwargs),) = host.calls
    assert (kwargs["_sudo"], kwargs["_timeout"]) == (True, 120 + serving.DRAIN_SLACK_S)
    assert host.said == ["vllm-router sends no new request to the batch: drained http://10.0.0.11:8000 in 0.6 s"]
