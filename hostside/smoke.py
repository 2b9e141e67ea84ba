"""Wait for an engine to be ready and check that it really serves: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON: {"unit", "url", "served_name", "prompt",
"expect", "timeout_s", "max_tokens" (64 when absent: releases recorded before it), "key_file",
"key_var", "restarts" (systemd's restarts of the unit already seen, 0 when absent),
"restarts_file" (where to record them once it answers, none when absent), "verify_cache" (the
weights' verification cache, removed when the engine exits before it is ready)}. Exit 0 when /health
is up, /v1/models lists the served name, and a chat completion answered by the served name has
``expect`` in its content with a finish_reason; exit 1 otherwise, with the reason and the unit's
journal tail. An engine that exited names the first exception its last run logged
(``torch._inductor.exc.InductorError: ...``, a safetensors error): the cause, which a
multi-process engine prints long before the tail's "see root cause above". An answer that used
its whole budget (finish_reason "length") without ``expect`` is a failure of its own, told
apart: the budget, not the server, may be what is wrong (a reasoning parser spends tokens on
reasoning_content first).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from typing import Any


def _key(req: dict[str, Any]) -> str | None:
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


def _call(url: str, key: str | None, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    # The URL is the deploy's own http://ADDRESS:PORT of the engine, never user input.
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, None


def _state(unit: str) -> dict[str, str]:
    show = subprocess.run(
        ["systemctl", "show", f"{unit}.service", "-p", "ActiveState,SubState,NRestarts,ExecMainStatus"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
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


def _fail(req: dict[str, Any], reason: str, exited: bool = False) -> None:
    journal = subprocess.run(
        ["journalctl", "-u", f"{req['unit']}.service", "-n", "1000", "--no-pager", "-o", "cat"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = journal.stdout.splitlines()
    tail = lines[-20:]
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
    print(json.dumps({"ok": False, "reason": reason, "journal": tail}))
    # One line that says what failed, then the unit's own last words.
    print(f"kimi-deploy: {req['unit']}: {reason}; journal tail:", file=sys.stderr)
    for line in tail:
        print(f"    {line}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    req = json.loads(zlib.decompress(base64.b64decode(sys.argv[1])))
    key = _key(req)
    base = req["url"].rstrip("/")
    started = time.monotonic()
    deadline = started + float(req["timeout_s"])
    while True:
        status, _ = _call(f"{base}/health", key)
        if status == 200:
            break
        state = _state(req["unit"])
        if state.get("ActiveState") in ("failed", "inactive"):
            _fail(req, f"{req['unit']} is {state.get('ActiveState')} before it became ready", exited=True)
        if state.get("SubState") == "auto-restart" or int(state.get("NRestarts") or 0) > int(req.get("restarts") or 0):
            # Exited since this converge started it (or since the host probe saw it restarted by
            # systemd): systemd's restarts will not make it ready.
            code = state.get("ExecMainStatus")
            _fail(req, f"{req['unit']} exited with status {code} before it became ready", exited=True)
        if time.monotonic() > deadline:
            _fail(req, f"not ready after {req['timeout_s']} s (last /health status {status})")
        time.sleep(0.2)
    ready = time.monotonic() - started
    status, models = _call(f"{base}/v1/models", key)
    names = [m.get("id") for m in (models or {}).get("data", [])]
    if req["served_name"] not in names:
        _fail(req, f"/v1/models lists {names}, not {req['served_name']!r} (status {status})")
    body = {
        "model": req["served_name"],
        "messages": [{"role": "user", "content": req["prompt"]}],
        "temperature": 0,
        "max_tokens": int(req.get("max_tokens") or 64),
    }
    status, answer = _call(f"{base}/v1/chat/completions", key, body)
    try:
        choice = answer["choices"][0]
        content = choice["message"]["content"] or ""
        reasoning = choice["message"].get("reasoning_content") or ""
        finish = choice.get("finish_reason")
    except (TypeError, KeyError, IndexError, AttributeError):
        _fail(req, f"chat completion answered status {status} without a choice")
        return
    if answer.get("model") != req["served_name"]:
        _fail(req, f"chat completion answered by model {str(answer.get('model'))[:80]!r}, not {req['served_name']!r}")
    if finish == "length" and req["expect"] not in content:
        _fail(
            req,
            f"chat completion used its whole budget of {body['max_tokens']} tokens (finish_reason length) "
            f"with {len(reasoning)} characters of reasoning and content {content[:80]!r}, without {req['expect']!r}: "
            "raise smoke.max_tokens before concluding the server is broken",
        )
    if req["expect"] not in content or not finish:
        _fail(req, f"chat completion content {content[:80]!r} (finish_reason {finish}) lacks {req['expect']!r}")
    if req.get("restarts_file"):
        # The restarts of systemd's own this answer vouches for: the next converge checks the unit
        # again only when it restarted once more (hostside/state_probe.py reads this file).
        with open(req["restarts_file"], "w", encoding="utf-8") as f:
            f.write(f"{int(_state(req['unit']).get('NRestarts') or 0)}\n")
    print(json.dumps({"ok": True, "ready_s": round(ready, 3), "content": content[:80], "finish_reason": finish}))


if __name__ == "__main__":
    main()
