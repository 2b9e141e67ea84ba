"""Wait (bounded) until the router sends requests to the engines a batch just (re)started: prints one JSON line.

Input: one argument, base64 of zlib-compressed JSON: {"router" (its package, named in what is
printed), "metrics" (its Prometheus page on loopback), "gauge" (its health gauge of each engine:
vllm-router's ``vllm_router_worker_health``, sglang-router's ``smg_worker_health``, one sample per
engine labelled ``worker="URL"``, 1 while the router sends to it), "circuit" and "circuit_open_s"
(its gauge of each engine's circuit breaker, 1 while open, and the time a circuit stays open),
"workers" (the URLs the router knows the batch's engines by), "timeout_s"}.

A batch's engines answer their own smoke test before the next batch stops anything, but the
router takes an engine back only once its own health checks pass (the recipe's ``router.health``)
and, when requests to it failed while it restarted, once its circuit breaker lets requests through
again: until then it sends every request to the engines the next batch is about to stop. The
circuit's gauge changes only when a request comes (measured of vllm-router 0.1.17: still open 20 s
after its time was up, with no traffic), but its time counts from the last failed request, before
the engine answered its smoke test: ``circuit_open_s`` after the wait starts, an open circuit lets
trial requests through. Exit 0 once every listed engine the router knows is healthy and its
circuit closed or past its time; an engine it does not list is one it learns of when
it restarts after every batch, and no router answering on ``metrics`` (none started yet, or one
told to serve its metrics elsewhere) leaves nothing to wait on: both are said, not waited
for. Exit 1 when ``timeout_s`` is up, naming the engines the router still counts unhealthy, or,
when what answers on ``metrics`` never gave a page (not HTTP, too long, too slow), what it gave
last. The page is read within bounds (``MAX_BYTES``, 2 s a request, answer included) and only the
gauge's samples of the listed URLs are taken from it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

from kimi_deploy.hostside.boundary_http import Unanswered, ask
from kimi_deploy.hostside.request import read_request

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import RouterViewRequest


MAX_BYTES = 8 << 20
POLL_S = 0.5
REQUEST_S = 2.0


def health(page: str, gauge: str, workers: list[str]) -> dict[str, float]:
    """The gauge's value for each listed worker the page has a sample of (``NAME{worker="URL"} V``,
    other labels allowed); a sample that is not a number is left out."""
    wanted = set(workers)
    found: dict[str, float] = {}
    for line in page.splitlines():
        if not line.startswith(gauge + "{"):
            continue
        labels, close, value = line[len(gauge) + 1 :].partition("}")
        if not close:
            continue
        for label in labels.split(","):
            name, eq, quoted = label.strip().partition("=")
            url = quoted[1:-1] if len(quoted) >= 2 and quoted[0] == quoted[-1] == '"' else None
            if name == "worker" and eq and url in wanted:
                with contextlib.suppress(ValueError, IndexError):
                    found[url] = float(value.split()[0])
    return found


def _page(url: str, router: str) -> str | None:
    """The metrics page ("" for an error status), or None when nothing accepts a connection
    there; ``Unanswered`` when what does gives no page within bounds."""
    try:
        answer = ask(url, what=f"{router}'s metrics", timeout_s=REQUEST_S, max_bytes=MAX_BYTES)
    except Unanswered as exc:
        if not exc.reached:
            return None
        raise
    return answer.body.decode("utf-8", errors="replace") if 200 <= answer.status < 300 else ""


def wait(req: RouterViewRequest) -> tuple[int, dict[str, Any]]:
    workers: list[str] = list(req["workers"])
    started = time.monotonic()
    deadline = started + float(req["timeout_s"])
    while True:
        try:
            page = _page(req["metrics"], req["router"])
        except Unanswered as exc:
            # something answers there, and not with a page: waited through like an unhealthy gauge
            if time.monotonic() >= deadline:
                reason = (
                    f"{exc}, until the wait's {req['timeout_s']} s were up: "
                    "the next batch would stop the engines it sends to"
                )
                return 1, {"ok": False, "waited_s": round(time.monotonic() - started, 3), "reason": reason}
            time.sleep(POLL_S)
            continue
        waited = round(time.monotonic() - started, 3)
        if page is None:
            said = f"no {req['router']} answers on {req['metrics']}: nothing to wait on"
            return 0, {"ok": True, "waited_s": waited, "said": said}
        seen = health(page, req["gauge"], workers)
        out = [w for w in workers if w in seen and seen[w] != 1]
        circuit = health(page, req["circuit"], workers) if req.get("circuit") else {}
        opened = [w for w in workers if circuit.get(w) == 1]
        timed = waited >= float(req.get("circuit_open_s") or 0)
        if not out and (not opened or timed):
            unknown = [w for w in workers if w not in seen]
            routed = [w for w in workers if w in seen]
            return 0, {"ok": True, "waited_s": waited, "routed": routed, "unknown": unknown, "circuit_open": opened}
        if time.monotonic() >= deadline:
            reason = (
                f"{req['router']} still counts {', '.join(out)} unhealthy after {req['timeout_s']} s "
                "(its health gauge 0): the next batch would stop the engines it sends to"
            )
            return 1, {"ok": False, "waited_s": waited, "reason": reason}
        time.sleep(POLL_S)


def main() -> None:
    req: RouterViewRequest = read_request()
    code, said = wait(req)
    print(json.dumps(said))
    if code:
        print(f"kimi-deploy: router: {said['reason']}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
