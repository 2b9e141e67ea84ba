"""hostside/router_view.py's reading of a router's metrics page: only the gauge's samples of the
engines asked about, whole URLs only, anything else on the page (other series, broken lines, values
that are not numbers) left out. Its waiting is held to the real vllm-router in
``tests/localcluster/test_standins.py``."""

from __future__ import annotations

import threading

from kimi_deploy.hostside.requests import RouterViewRequest
from kimi_deploy.hostside.router_view import health, wait
from tests.hostile_http import (
    BAD_STATUS,
    Hostile,
    answer,
    unanswered,
    within,
)

GAUGE = "vllm_router_worker_health"
A, B = "http://10.41.0.11:8000", "http://10.41.0.13:8000"

# The gauge's lines as vllm-router 0.1.17 printed them (its /metrics, two workers), and hostile ones.
PAGE = f"""# TYPE vllm_router_active_workers gauge
vllm_router_active_workers 2
# TYPE {GAUGE} gauge
{GAUGE}{{worker="{A}"}} 1
{GAUGE}{{worker="{B}"}} 0
{GAUGE}{{worker="{B}x"}} 1
{GAUGE}_other{{worker="{A}"}} 0
{GAUGE}{{worker="{A}"
{GAUGE}{{worker="http://10.41.0.31:8000"}} NaNa
smg_worker_health{{worker="{B}"}} 1
"""


def test_the_gauge_of_each_engine_asked_about() -> None:
    assert health(PAGE, GAUGE, [A, B]) == {A: 1.0, B: 0.0}


def test_an_engine_the_page_has_no_sample_of_is_absent() -> None:
    assert health(PAGE, GAUGE, ["http://10.41.0.31:8000", "http://10.41.0.99:8000"]) == {}


def test_other_labels_beside_the_worker_are_allowed() -> None:
    assert health(f'{GAUGE}{{model="kimi",worker="{A}"}} 1\n', GAUGE, [A]) == {A: 1.0}


def test_sglang_routers_gauge_is_read_by_its_name() -> None:
    assert health(PAGE, "smg_worker_health", [A, B]) == {B: 1.0}


@unanswered("/metrics", "no whole answer in 2 s")
def test_a_metrics_page_answered_by_something_else_fails_the_wait_in_one_line(
    sent: bytes, endless: tuple[str, ...], said: str
) -> None:
    with Hostile(default=sent, endless=endless) as server:
        request: RouterViewRequest = {
            "router": "vllm-router",
            "metrics": f"{server.url}/metrics",
            "gauge": GAUGE,
            "workers": [A, B],
            "timeout_s": 1,
        }
        code, result = within(20, lambda: wait(request))
    assert code == 1
    assert result["reason"] == (
        f"vllm-router's metrics at {server.url[7:]}: {said}, until the wait's 1 s were up: "
        "the next batch would stop the engines it sends to"
    )
    assert len(server.asked) >= 1


def test_a_router_that_answers_again_is_waited_for() -> None:
    page = answer(PAGE.replace(f'{GAUGE}{{worker="{B}"}} 0', f'{GAUGE}{{worker="{B}"}} 1').encode(), kind="text/plain")
    with Hostile(default=BAD_STATUS) as server:
        request: RouterViewRequest = {
            "router": "vllm-router",
            "metrics": f"{server.url}/metrics",
            "gauge": GAUGE,
            "workers": [A, B],
            "timeout_s": 10,
        }
        threading.Timer(0.6, lambda: server.answers.update({"/metrics": page})).start()
        code, result = within(20, lambda: wait(request))
    assert (code, result["ok"], result["routed"]) == (0, True, [A, B])
