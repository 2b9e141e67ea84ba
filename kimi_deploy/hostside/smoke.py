"""Wait for an engine to be ready and check that it really serves: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON: {"unit", "url", "served_name", "prompt",
"expect", "timeout_s", "max_tokens" (64 when absent: releases recorded before it), "key_file",
"key_var", "restarts" (systemd's restarts of the unit already seen, 0 when absent),
"restarts_file" (where to record them once it answers, none when absent), "verify_cache" (the
weights' verification cache, removed when the engine exits before it is ready), "backend" (a
gateway's router, whose /health must answer too: a gateway with a hosted fallback answers while
its router is not up)}. Exit 0 when /health
is up, /v1/models lists the served name, and a chat completion answered by the served name has
``expect`` as its content with a finish_reason (the final answer alone, white space, quotes,
emphasis and a closing full stop aside: thinking text that quotes the prompt's word is no
answer); exit 1 otherwise, with the reason and the unit's
journal tail. An engine that exited names the first exception its last run logged
(``torch._inductor.exc.InductorError: ...``, a safetensors error): the cause, which a
multi-process engine prints long before the tail's "see root cause above". An answer that used
its whole budget (finish_reason "length") without ``expect`` is a failure of its own, told
apart: the budget, not the server, may be what is wrong (a reasoning parser spends tokens on
reasoning_content first). With "tool" ({"name", "prompt", "result"}: the recipe's
smoke.tool_call, on a topology whose engines parse tool calls), one tool-call round trip
follows: the answer to ``prompt`` offering the function ``name`` must call it; sent back with
the assistant's message as it came (its reasoning kept) and a ``tool`` message of ``result``
answering the call's id, the final answer must be ``expect``. Every answer is read within
bounds (``hostside.boundary_http``: its size, and its time whole; JSON through
``hostside.boundary_json``): whatever answers on the unit's port, a failure is one line naming
what it answered.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any, NoReturn

from kimi_deploy.hostside.boundary_http import Unanswered, ask
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_text import error_line, shown
from kimi_deploy.hostside.request import read_request

# The most of an answer read: a chat completion of the largest smoke budget, its reasoning
# included, is well under it.
ANSWER_BYTES = 4 << 20
# The most one request may take, its whole answer included.
CALL_S = 30.0


def read_key(req: dict[str, Any]) -> str | None:
    if not req.get("key_file"):
        return None
    try:
        with open(req["key_file"], encoding="utf-8") as f:
            for line in f:
                # ``NAME=value`` (an EnvironmentFile) or ``name: "value"`` (a YAML options file).
                name, _, value = line.strip().partition(":" if req["key_file"].endswith(".yaml") else "=")
                if name.strip() == req["key_var"]:
                    value = value.strip()
                    return str(json.loads(value)) if value.startswith('"') else value
    except OSError:
        return None
    return None


def _call(
    url: str, key: str | None, body: Any = None, *, what: str = "API", timeout_s: float = CALL_S
) -> tuple[int, Any, str | None]:
    """A request to the deploy's own ``http://ADDRESS:PORT`` of the unit's API (POST of ``body`` as
    JSON, else GET; the key as a bearer token): (status, the answer's JSON, why there is none, in
    one line). Status 0: no HTTP answer at all (nothing listening, something else answering, too
    long, too slow); a status with JSON None: its body is not JSON within bounds."""
    try:
        answer = ask(url, what=what, key=key, body=body, timeout_s=timeout_s, max_bytes=ANSWER_BYTES)
    except Unanswered as exc:
        return 0, None, str(exc)
    try:
        return answer.status, loads(answer.body or b"null", answer.where), None
    except ValueError as exc:
        return answer.status, None, str(exc)


# When the unit last left the active state (systemd's CLOCK_MONOTONIC, microseconds; 0: not since boot)
_LEFT = "ActiveExitTimestampMonotonic"


def _down_s(state: dict[str, str]) -> float | None:
    """Seconds since the unit last left the active state (a stop or a restart began): how long it
    was without service, now that it answers; None when it did not since boot (a first start)."""
    left = state.get(_LEFT, "")
    if not left.isdigit() or int(left) == 0:
        return None
    return round(max(0.0, time.monotonic() - int(left) / 1e6), 1)


def _state(unit: str) -> dict[str, str]:
    show = subprocess.run(
        ["systemctl", "show", f"{unit}.service", "-p", f"ActiveState,SubState,NRestarts,ExecMainStatus,{_LEFT}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(line.split("=", 1) for line in show.stdout.splitlines() if "=" in line)


# A traceback's last line, "pkg.mod.SomeError: text", alone or after vLLM's error-level log prefix
# ("(Worker pid=1049) ERROR 12-01 18:18:04 [multiproc_executor.py:1063] "); a warning that
# merely quotes an error ("... fd limit errors like `OSError: ...`") is no exception.
_EXCEPTION = re.compile(
    r"(?:\([^()]{1,40} pid=\d+\) )?(?:ERROR \S+ \S+ \[[^\]]{1,80}\] )?"
    r"((?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Exit): \S.*)"
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _first_exception(lines: list[str], unit: str) -> str | None:
    """The first exception line logged since systemd last started ``unit``, bounded, one line."""
    started = [i for i, line in enumerate(lines) if line.startswith(f"Started {unit}.service")]
    for line in lines[started[-1] if started else 0 :]:
        found = _EXCEPTION.match(line)
        if found:
            return _CONTROL.sub(" ", found.group(1))[:300]
    return None


class Failed(Exception):
    """A check that failed: ``reason`` in one line, and the unit's journal tail."""

    def __init__(self, reason: str, journal: list[str]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.journal = journal


def _fail(req: dict[str, Any], reason: str, exited: bool = False) -> NoReturn:
    journal = subprocess.run(
        ["journalctl", "-u", f"{req['unit']}.service", "-n", "1000", "--no-pager", "-o", "cat"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = journal.stdout.splitlines()
    cause = _first_exception(lines, req["unit"]) if exited else None
    if cause:
        reason = f"{reason}: {cause}"
    if exited and req.get("verify_cache"):
        # An engine that failed before it served may have read a file gone bad since it was
        # verified (the cache trusts size, mtime and inode): the next converge hashes them all.
        try:
            os.remove(req["verify_cache"])
            reason += "; the next converge verifies its weights again"
        except FileNotFoundError:
            pass
    raise Failed(reason, lines[-20:])


def _choice(req: dict[str, Any], key: str | None, body: dict[str, Any], what: str) -> tuple[dict[str, Any], Any]:
    """The first choice's message of the answer to ``body``, and its finish_reason."""
    status, answer, why = _call(f"{req['url'].rstrip('/')}/v1/chat/completions", key, body)
    if status == 0 or (status == 200 and why):
        _fail(req, f"{what}: {why}")
    try:
        choice = answer["choices"][0]
        message = choice["message"]
        finish = choice.get("finish_reason")
        if not isinstance(message, dict):
            raise TypeError
    except (TypeError, KeyError, IndexError, AttributeError):
        _fail(req, f"{what} answered status {status} without a choice")
    if answer.get("model") != req["served_name"]:
        _fail(req, f"{what} answered by model {str(answer.get('model'))[:80]!r}, not {req['served_name']!r}")
    return message, finish


def _reasoning(message: dict[str, Any]) -> str:
    # vLLM 0.32 names it ``reasoning`` (ChatMessage.reasoning; ``reasoning_content`` is taken on
    # input as a deprecated name), SGLang ``reasoning_content``.
    return str(message.get("reasoning") or message.get("reasoning_content") or "")


def _answer(req: dict[str, Any], key: str | None, body: dict[str, Any], what: str) -> tuple[str, Any]:
    """The content of the answer to ``body``, which must hold ``expect``, and its finish_reason."""
    message, finish = _choice(req, key, body, what)
    content = str(message.get("content") or "")
    if finish == "length" and req["expect"] not in content:
        _fail(
            req,
            f"{what} used its whole budget of {body['max_tokens']} tokens (finish_reason length) "
            f"with {len(_reasoning(message))} characters of reasoning and content {content[:80]!r}, "
            f"without {req['expect']!r}: raise smoke.max_tokens before concluding the server is broken",
        )
    if req["expect"] not in content or not finish:
        _fail(req, f"{what} content {content[:80]!r} (finish_reason {finish}) lacks {req['expect']!r}")
    if final(content) != req["expect"]:
        # The prompt names the word: thinking text that quotes it (a reasoning model served without
        # its reasoning parser puts it in the content) holds it too, and proves nothing.
        _fail(
            req,
            f"{what} content {content[:80]!r} is more than the answer {req['expect']!r} "
            "(a reasoning model's thinking in the content? set the topology's parsers.reasoning)",
        )
    return content, finish


def final(content: str) -> str:
    """The answer as a reader takes it: without the white space, quotes or emphasis around it and
    a closing full stop."""
    return content.strip().strip("`*\"'").strip().removesuffix(".").strip()


# What of the assistant's message goes back in the next turn: everything of the conversation.
_SENT_BACK = ("role", "content", "tool_calls", "reasoning", "reasoning_content")


def _function(call: dict[str, Any]) -> dict[str, Any]:
    """A tool call's ``function``, or {} when it has none that is an object."""
    function = call.get("function")
    return function if isinstance(function, dict) else {}


def _round_trip(req: dict[str, Any], key: str | None, body: dict[str, Any], tool: dict[str, Any]) -> None:
    """Offered the function, the engine calls it; given its result, it answers."""
    name = tool["name"]
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": "The deploy's smoke test: returns the word to answer with.",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    asked = [{"role": "user", "content": tool["prompt"]}]
    first = {**body, "messages": asked, "tools": tools, "tool_choice": "auto"}
    message, finish = _choice(req, key, first, "tool-call request")
    calls = message.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    called = [c for c in calls if _function(c).get("name") == name]
    if not called or not isinstance(called[0].get("id"), str):
        names = [str(_function(c).get("name"))[:40] for c in calls]
        _fail(
            req,
            f"tool-call request: asked to call {name!r}, the answer called {names} (finish_reason {finish}, "
            f"content {str(message.get('content') or '')[:80]!r})",
        )
    # The assistant's message goes back as it came: its reasoning with it (thinking models that
    # call tools need their reasoning kept across the turns).
    kept = {k: v for k, v in message.items() if k in _SENT_BACK}
    result = {"role": "tool", "tool_call_id": called[0]["id"], "content": tool["result"]}
    _answer(req, key, {**first, "messages": [*asked, kept, result]}, "tool-call result")


def wait_ready(req: dict[str, Any], key: str | None) -> float:
    """Seconds until the unit's /health answers 200; ``Failed`` when it exits or the time is up."""
    base = req["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + float(req["timeout_s"])
    while True:
        # each check bounded by the time left (at least a second: a slow answer is still told)
        bound = min(CALL_S, max(deadline - time.monotonic(), 1.0))
        status, _, why = _call(f"{base}/health", key, timeout_s=bound)
        last = f"/health: {why}" if status == 0 else f"/health status {status}"
        if status == 200 and req.get("backend"):
            # behind a gateway that falls back: its router's own /health (loopback, no key)
            status, _, why = _call(f"{req['backend']}/health", None, what="router", timeout_s=bound)
            last = f"/health: {why}" if status == 0 else f"router's /health status {status}"
        if status == 200:
            return time.monotonic() - started
        state = _state(req["unit"])
        if state.get("ActiveState") in ("failed", "inactive"):
            _fail(req, f"{req['unit']} is {state.get('ActiveState')} before it became ready", exited=True)
        if state.get("SubState") == "auto-restart" or int(state.get("NRestarts") or 0) > int(req.get("restarts") or 0):
            # Exited since this converge started it (or since the host probe saw it restarted by
            # systemd): systemd's restarts will not make it ready.
            code = state.get("ExecMainStatus")
            _fail(req, f"{req['unit']} exited with status {code} before it became ready", exited=True)
        if time.monotonic() > deadline:
            _fail(req, f"not ready after {req['timeout_s']} s (last {last})")
        time.sleep(0.2)


def serves(req: dict[str, Any]) -> dict[str, Any]:
    """The whole check of ``req`` (the module docstring's), its result; ``Failed`` otherwise."""
    key = read_key(req)
    base = req["url"].rstrip("/")
    ready = wait_ready(req, key)
    status, models, why = _call(f"{base}/v1/models", key)
    if status == 0:
        _fail(req, f"/v1/models: {why}")
    data = models.get("data") if isinstance(models, dict) else None
    names = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if req["served_name"] not in names:
        _fail(req, f"/v1/models lists {shown(names)}, not {req['served_name']!r} (status {status})")
    body = {
        "model": req["served_name"],
        "messages": [{"role": "user", "content": req["prompt"]}],
        "temperature": 0,
        "max_tokens": int(req.get("max_tokens") or 64),
    }
    content, finish = _answer(req, key, body, "chat completion")
    tool = req.get("tool")
    if tool:
        _round_trip(req, key, body, tool)
    state = _state(req["unit"])
    down_s = _down_s(state)
    if req.get("restarts_file"):
        # The restarts of systemd's own this answer vouches for: the next converge checks the unit
        # again only when it restarted once more; and how long it was without service, which the
        # next converge names before it restarts the only instance (hostside/state_probe.py).
        with open(req["restarts_file"], "w", encoding="utf-8") as f:
            f.write(f"{int(state.get('NRestarts') or 0)}{'' if down_s is None else f' {down_s}'}\n")
    done = {"ok": True, "ready_s": round(ready, 3), "down_s": down_s, "content": content[:80], "finish_reason": finish}
    return {**done, **({"tool_call": tool["name"]} if tool else {})}


def main() -> None:
    req = read_request()
    try:
        done = serves(req)
    except Exception as exc:  # noqa: BLE001 - whatever the engine answered, the check ends in one line
        why = f"the check failed unexpectedly: {error_line(exc, 200)}"
        failed = exc if isinstance(exc, Failed) else Failed(why, [])
        print(json.dumps({"ok": False, "reason": failed.reason, "journal": failed.journal}))
        # One line that says what failed, then the unit's own last words.
        print(f"kimi-deploy: {req['unit']}: {failed.reason}; journal tail:", file=sys.stderr)
        for line in failed.journal:
            print(f"    {line}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(done))


if __name__ == "__main__":
    main()
