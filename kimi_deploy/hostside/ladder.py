"""Climb the context ladder on this host: each rung started, probed and recorded, the last passing
rung left serving when one fails. Prints one JSON line; exit 1 with one line when a rung fails.

Input: one argument, base64 of zlib-compressed JSON:
  {"unit": name, "rungs": [{"rung": N, "release": digest, "files": [{"path", "content", "mode"}],
   "max_tokens": the smoke answer's budget at N}] (rising, the topology's target last),
   "back": the rung that served before, as a rung of "rungs" is (None: none served),
   "smoke": hostside/smoke.py's request at the target, "probe": the recipe's context_probe,
   "proof": {"key", "topology", "engine", "hardware"}, "release_dir": the current release's
   folder, "run": the run's id}

For each rung: its files (the unit, as the controller rendered it at that rung; never a secret)
written in place, systemd reloaded, the unit restarted and its applied markers written (the
digest, and the rung in ``<unit>.context``), then ready (hostside/smoke.py's wait), then
hostside/context_probe.py's probe; the target's rung answers the whole smoke test too. Every
rung's result is appended to the host's proofs (``/var/lib/kimi/ladder.json``) and the current
release's record (``ladder.json`` in its folder). The first rung that fails stops the climb: the
highest rung that passed (or the one that served before) is written back, restarted and smoke
tested, and the line names the rung and the engine's own reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from kimi_deploy.hostside import context_probe, smoke
from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.whole_file import write_whole

APPLIED = f"{STATE_DIR}/applied"
PROOFS = f"{STATE_DIR}/ladder.json"
# Where the rung's files may go: unit files and their drop-ins, nothing else.
UNIT_DIR = "/etc/systemd/system"
KEEP = 200


def _inside(path: str, folder: str) -> str:
    """``path`` resolved, refused unless it stays inside ``folder`` (host programs run as root)."""
    resolved = os.path.realpath(path)
    if os.path.commonpath([resolved, os.path.realpath(folder)]) != os.path.realpath(folder):
        raise SystemExit(f"kimi-deploy: context ladder: {path!r} is not inside {folder}")
    return resolved


def _systemctl(*args: str) -> None:
    subprocess.run(["systemctl", *args], check=False, capture_output=True, timeout=300)


def _start(req: dict[str, Any], rung: dict[str, Any]) -> None:
    """Put ``rung``'s files in place and (re)start the unit with them; record what runs."""
    for f in rung["files"]:
        write_whole(_inside(f["path"], UNIT_DIR), f["content"], int(f["mode"]))
    unit = req["unit"]
    _systemctl("daemon-reload")
    _systemctl("reset-failed", f"{unit}.service")
    _systemctl("restart", f"{unit}.service")
    os.makedirs(APPLIED, mode=0o755, exist_ok=True)
    write_whole(os.path.join(APPLIED, unit), f"{rung['release']}\n", 0o644)
    write_whole(os.path.join(APPLIED, f"{unit}.context"), f"{rung['rung']}\n", 0o644)


def _check(req: dict[str, Any], rung: dict[str, Any], final: bool) -> dict[str, Any]:
    """Ready, probed, and (``final``) smoke tested: the rung's result."""
    # A rung's failure to start is the rung's (KV cache, memory), not the weights': they stay trusted.
    check = {k: v for k, v in req["smoke"].items() if k not in ("verify_cache", "restarts_file")}
    check |= {"restarts": 0, "max_tokens": rung["max_tokens"]}
    key = smoke.read_key(check)
    try:
        ready = smoke.wait_ready(check, key)
        result = context_probe.measure(req, key, rung["rung"], f"{req['run']}/{rung['rung']}")
        result["ready_s"] = round(ready, 3)
        if final and result["passed"]:
            smoke.serves({**req["smoke"], "restarts": 0, "restarts_file": f"{APPLIED}/{req['unit']}.restarts"})
    except smoke.Failed as failed:
        return {"rung": rung["rung"], "passed": False, "reason": failed.reason}
    except Exception as exc:  # noqa: BLE001 - whatever broke, the climb goes back to the last rung that passed
        return {"rung": rung["rung"], "passed": False, "reason": f"the probe broke: {type(exc).__name__}: {exc}"[:300]}
    return result


def _record(req: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Append ``results`` to the host's proofs and put this release's in its record."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries = [{**req["proof"], "unit": req["unit"], **r, "at": stamp, "run": req["run"]} for r in results]
    try:
        with open(PROOFS, encoding="utf-8") as f:
            kept = json.load(f).get("proofs", [])
        kept = [p for p in kept if isinstance(p, dict)] if isinstance(kept, list) else []
    except (OSError, ValueError, AttributeError):
        kept = []
    kept = [*kept, *entries][-KEEP:]
    os.makedirs(STATE_DIR, mode=0o755, exist_ok=True)
    write_whole(PROOFS, json.dumps({"proofs": kept}, sort_keys=True) + "\n", 0o644)
    mine = [p for p in kept if p.get("key") == req["proof"]["key"]]
    if os.path.isdir(req["release_dir"]):
        write_whole(
            os.path.join(req["release_dir"], "ladder.json"), json.dumps({"proofs": mine}, sort_keys=True) + "\n", 0o644
        )


def _back(req: dict[str, Any], back: dict[str, Any] | None) -> str:
    """Serve ``back`` again (the last passing rung); what became of it, for the line."""
    unit = req["unit"]
    if back is None:
        _systemctl("stop", f"{unit}.service")
        return f"nothing served here before the climb: {unit} is stopped"
    _start(req, back)
    request = {
        **req["smoke"],
        "restarts": 0,
        "max_tokens": back["max_tokens"],
        "restarts_file": f"{APPLIED}/{unit}.restarts",
    }
    try:
        smoke.serves(request)
    except smoke.Failed as failed:
        return f"going back to {back['rung']} failed too: {failed.reason}"
    return f"{back['rung']} serves again"


def main() -> None:
    req = read_request()
    rungs = req["rungs"]
    results: list[dict[str, Any]] = []
    back = req.get("back")
    for i, rung in enumerate(rungs):
        began = time.monotonic()
        _start(req, rung)
        result = _check(req, rung, final=i == len(rungs) - 1)
        # the rung's whole cost: restart, ready, the prompt sized, the answer, the smoke test
        result["took_s"] = round(time.monotonic() - began, 3)
        results.append(result)
        if not result["passed"]:
            _record(req, results)
            went = _back(req, back)
            print(json.dumps({"ok": False, "results": results}))
            passed = ", ".join(str(r["rung"]) for r in results if r["passed"]) or "none"
            print(
                f"kimi-deploy: context ladder: {req['unit']} at {rung['rung']} tokens: {result['reason']}; "
                f"the climb stops there, {went} (passed in this climb: {passed})",
                file=sys.stderr,
            )
            sys.exit(1)
        back = rung
    _record(req, results)
    print(json.dumps({"ok": True, "results": results}))


if __name__ == "__main__":
    main()
