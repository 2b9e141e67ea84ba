"""Take engines out of the router before they restart, and back once they serve: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON: {"router" (its package, named in what is
printed), "api" (the router's own API on loopback, ``http://127.0.0.1:PORT``), "phase" ("out" or
"in"), "workers" (the URLs the router knows the engines by), "timeout_s" (the most a drain
waits for the requests in flight), "drained_file" (where the engines taken out are recorded,
``ROUTER_DRAINED`` when absent)}.

"out": each listed engine the router lists is removed from it (vllm-router's ``POST
/remove_worker?url=``: the router sends it no new request, and the requests it already sent run to
their end), then each engine's own Prometheus page (``URL/metrics``: vLLM's
``vllm:num_requests_running`` and ``vllm:num_requests_waiting``) is read until it holds no request
twice in a row (a request the router chose just before the removal reaches the engine a moment
later), at most ``timeout_s``. An engine whose router lists no other engine is left in: taken out,
its clients would get the router's 503 rather than a wait. Exit 0 with the time each engine took to
drain (what it still held after ``timeout_s``, said, is cut by its restart).

Before it removes any, "out" records them in ``ROUTER_DRAINED``; "in" drops them from it once the router
lists them again: a converge that stopped in between leaves the next one (its probe reads the file)
the engines to put back.

"in": each listed engine the router does not list is added back (``POST /add_worker?url=``: the
router checks its ``/health`` first, which a smoke-tested engine answers at once). Exit 0 once the
router lists them all.

Exit 1 when the router does not answer within bounds or does not do what was asked (an engine
still listed after its removal, or not listed after it was added), naming it. No router answering
on ``api`` (none started yet) leaves nothing to drain: said, exit 0. Every answer is read within
bounds (``hostside.boundary_http``; JSON through ``hostside.boundary_json``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.parse
from typing import Any

from kimi_deploy.hostside.boundary_http import Unanswered, ask
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.host_dirs import ROUTER_DRAINED
from kimi_deploy.hostside.request import read_request

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import DrainRequest


MAX_BYTES = 4 << 20
REQUEST_S = 5.0
# adding an engine: the router checks its health first (at once for one that answers)
ADD_S = 60.0
POLL_S = 0.5
# the engine's gauges of the requests it holds
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _kept(req: DrainRequest) -> list[str]:
    try:
        with open(req.get("drained_file") or ROUTER_DRAINED, "rb") as f:
            found = loads(f.read(MAX_BYTES), "the drained engines' file")
    except (OSError, ValueError):
        return []
    return [u for u in found if isinstance(u, str)] if isinstance(found, list) else []


def _keep(req: DrainRequest, urls: list[str]) -> None:
    """Record ``urls`` as out of the router (none: remove the record), replacing the file whole."""
    path = req.get("drained_file") or ROUTER_DRAINED
    if not urls:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(f"{path}.new", "w", encoding="utf-8") as f:
        json.dump(sorted(set(urls)), f)
    os.replace(f"{path}.new", path)


class Failed(Exception):
    pass


def listed(req: DrainRequest) -> list[str] | None:
    """The engines the router lists (``GET /list_workers``), or None when no router answers."""
    try:
        answer = ask(f"{req['api']}/list_workers", what=req["router"], timeout_s=REQUEST_S, max_bytes=MAX_BYTES)
    except Unanswered as exc:
        if not exc.reached:
            return None
        raise Failed(str(exc)) from None
    try:
        urls = loads(answer.body, answer.where).get("urls") if answer.status == 200 else None
    except (ValueError, AttributeError) as exc:
        raise Failed(f"{answer.where}: {exc}") from None
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise Failed(f"{answer.where}: answered {answer.status} without a list of its engines")
    return urls


def _post(req: DrainRequest, path: str, url: str, timeout_s: float) -> None:
    target = f"{req['api']}/{path}?url={urllib.parse.quote(url, safe='')}"
    try:
        answer = ask(target, what=req["router"], body={}, timeout_s=timeout_s, max_bytes=MAX_BYTES)
    except Unanswered as exc:
        raise Failed(str(exc)) from None
    # an engine added while it already was: as asked
    if answer.status != 200 and not (path == "add_worker" and b"already exists" in answer.body):
        raise Failed(f"{answer.where}: {path} {url} answered {answer.status}")


def in_flight(page: str) -> float:
    """The requests an engine's Prometheus page says it holds (every sample of ``IN_FLIGHT``)."""
    total = 0.0
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in IN_FLIGHT:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return total


def _held(url: str) -> float | None:
    """What the engine at ``url`` holds now; None when it gives no page (then nothing waits on it)."""
    try:
        answer = ask(f"{url}/metrics", what="engine metrics", timeout_s=REQUEST_S, max_bytes=MAX_BYTES)
    except Unanswered:
        return None
    return in_flight(answer.body.decode("utf-8", errors="replace")) if answer.status == 200 else None


def out(req: DrainRequest) -> dict[str, Any]:
    workers: list[str] = list(req["workers"])
    started = time.monotonic()
    found = listed(req)
    if found is None:
        return {"ok": True, "said": f"no {req['router']} answers on {req['api']}: nothing to drain"}
    if not [u for u in found if u not in workers]:
        return {"ok": True, "said": f"{req['router']} sends to no other engine: left in", "drained_s": {}}
    # recorded first: a run that stops from here on leaves the next one what to put back
    _keep(req, [*_kept(req), *workers])
    for url in workers:
        if url in found:
            _post(req, "remove_worker", url, REQUEST_S)
    still = [u for u in (listed(req) or []) if u in workers]
    if still:
        raise Failed(f"{req['router']} still lists {', '.join(still)} after removing it")
    deadline = started + float(req["timeout_s"])
    drained: dict[str, float] = {}
    held: dict[str, float] = {}
    quiet = dict.fromkeys(workers, 0)
    while len(drained) < len(workers):
        for url in workers:
            if url in drained:
                continue
            now = _held(url)
            quiet[url] = quiet[url] + 1 if not now else 0
            if quiet[url] >= 2:
                drained[url] = round(time.monotonic() - started, 3)
            elif now:
                held[url] = now
        if len(drained) < len(workers):
            if time.monotonic() >= deadline:
                left = {u: held.get(u, 0.0) for u in workers if u not in drained}
                return {"ok": True, "drained_s": drained, "left": left, "waited_s": req["timeout_s"]}
            time.sleep(POLL_S)
    return {"ok": True, "drained_s": drained}


def back_in(req: DrainRequest) -> dict[str, Any]:
    workers: list[str] = list(req["workers"])
    found = listed(req)
    if found is None:
        return {"ok": True, "said": f"no {req['router']} answers on {req['api']}: nothing to add to"}
    added = [u for u in workers if u not in found]
    for url in added:
        _post(req, "add_worker", url, ADD_S)
    missing = [u for u in workers if u not in (listed(req) or [])]
    if missing:
        raise Failed(f"{req['router']} does not list {', '.join(missing)} after adding it")
    _keep(req, [u for u in _kept(req) if u not in workers])
    return {"ok": True, "added": added}


def main() -> None:
    req: DrainRequest = read_request()
    try:
        said = out(req) if req["phase"] == "out" else back_in(req)
    except Failed as exc:
        print(json.dumps({"ok": False, "reason": str(exc)}))
        print(f"kimi-deploy: router: {exc}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(said))


if __name__ == "__main__":
    main()
