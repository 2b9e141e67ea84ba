"""``kimi-deploy status`` (``deploys/status.py``) prints what serves where from the state the converge
reads: one row per host and unit (its place, systemd's state and since when, the watchdog's state,
the last smoke test, the release serving and its revision), what needs an eye, the benchmark figures
kept with the release, and each topology's endpoints with a curl. Hosts' answers here are typed
probe answers (``tests/host_converge.probe_answer``) of the example recipe's plan; what came from
a host reaches the terminal escaped, and the API key is never printed, only where the shell reads it.
"""

from __future__ import annotations

import os
from typing import Any, cast

import pytest

from kimi_deploy.converge.plan import Converge, plan_converge
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.probe_types import ReleaseEntry
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan, part_of
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe, SecretRef
from kimi_deploy.serving.status_table import HEADER, HostStatus, ago, format_status
from tests.conftest import RECIPE
from tests.host_converge import probe_answer

NOW = 1_790_000_000.0


def planned(recipe: Recipe, prod: Inventory, name: str) -> tuple[DeployPlan, Converge]:
    """``name``'s part of the example plan and its converge, as the status deploy plans them (no secret read)."""
    deploy = part_of(recipe, RECIPE, prod.host(name), plan(recipe, RECIPE, prod))
    return deploy, plan_converge(deploy, os.environ, plan_only=True)


def serving(todo: Converge, **kept: Any) -> HostState:
    """The probe's answer on a host that serves ``todo``'s release as planned, each unit active for
    two minutes, with the release's record as the host keeps it (and ``kept`` laid over it)."""
    found = probe_answer(todo)
    for state in found["units"].values():
        state["since"] = NOW - 120
    found["last_release"] = ["2026-09-21T10:00:00Z", todo.release.dir, "serving"]
    entry: ReleaseEntry = {
        "record": dict(todo.release.record),
        "engine": True,
        "model": True,
        "files": True,
        "bench": None,
        "cold_start": None,
    }
    found["releases"] = {
        "entries": [["2026-09-21T10:00:00Z", todo.release.dir, "serving", "r1"]],
        "records": {todo.release.dir: cast(ReleaseEntry, {**entry, **kept})},
    }
    return found


def status(
    recipe: Recipe, prod: Inventory, name: str, found: HostState | None = None, error: str | None = None
) -> HostStatus:
    deploy, todo = planned(recipe, prod, name)
    return HostStatus(name, deploy, todo, serving(todo) if found is None and error is None else found, error)


def table(text: str) -> list[dict[str, str]]:
    """The table's rows as {column: cell}, cut at the header's columns."""
    lines = text.split("\n\n", 1)[0].splitlines()
    starts = [lines[0].index(column) for column in HEADER]
    ends = [*starts[1:], None]
    return [
        {column: line[start:end].strip() for column, start, end in zip(HEADER, starts, ends, strict=True)}
        for line in lines[1:]
    ]


def test_each_host_and_unit_shows_its_state_since_smoke_and_the_release_serving(
    recipe: Recipe, prod: Inventory
) -> None:
    one, router = status(recipe, prod, "b300-01"), status(recipe, prod, "gb300-rt01")
    rows = table(format_status([one, router], now=NOW))
    assert one.todo is not None
    assert router.todo is not None
    assert [(r["HOST"], r["UNIT"]) for r in rows] == [("b300-01", u.name) for u in one.todo.units] + [
        ("gb300-rt01", u.name) for u in router.todo.units
    ]
    engine = rows[0]
    record = one.todo.release.record
    assert engine == {
        "HOST": "b300-01",
        "TOPOLOGY": "single-node",
        "ROLE": "serve#0 single",
        "UNIT": "kimi-vllm",
        "STATE": "active (running)",
        "SINCE": "2 min ago",
        "WATCHDOG": "no state yet",
        "SMOKE": "passed",
        "RELEASE": f"vllm {record['engine_version']} ({os.path.basename(one.todo.release.dir)[:12]})",
        "REVISION": str(record["revision"])[:12],
    }
    # the host's own cells once, on its first row; a unit without a smoke test has none
    assert rows[1]["UNIT"] == "kimi-watchdog"
    assert (rows[1]["TOPOLOGY"], rows[1]["RELEASE"], rows[1]["SMOKE"], rows[1]["WATCHDOG"]) == ("", "", "-", "-")
    gateway = next(r for r in rows if r["UNIT"] == "kimi-gateway")
    assert gateway["SMOKE"] == "passed"
    first = next(r for r in rows if r["HOST"] == "gb300-rt01")
    # a router release serves no weights revision
    assert (first["ROLE"], first["RELEASE"].split(" (")[0], first["REVISION"]) == ("router", "vllm-router 0.1.17", "-")


def test_a_failed_unit_a_restart_after_its_smoke_test_and_a_start_not_yet_tested_are_told_apart(
    recipe: Recipe, prod: Inventory
) -> None:
    deploy, todo = planned(recipe, prod, "gb300-rt01")
    found = serving(todo)
    found["units"]["kimi-router"] |= {"active": "failed", "sub": "failed", "since": NOW - 7200}
    found["units"]["kimi-gateway"] |= {"restarts": 2, "restarts_verified": 1}
    found["units"]["kimi-mooncake-master"] |= {"active": "activating", "sub": "start", "since": None}
    rows = {r["UNIT"]: r for r in table(format_status([HostStatus("gb300-rt01", deploy, todo, found)], now=NOW))}
    assert (rows["kimi-router"]["STATE"], rows["kimi-router"]["SINCE"]) == ("failed", "2 h ago")
    assert rows["kimi-gateway"]["SMOKE"] == "restarted since"
    assert (rows["kimi-mooncake-master"]["STATE"], rows["kimi-mooncake-master"]["SINCE"]) == ("activating (start)", "-")
    found["units"]["kimi-gateway"] |= {"verified": False}
    rows = {r["UNIT"]: r for r in table(format_status([HostStatus("gb300-rt01", deploy, todo, found)], now=NOW))}
    assert rows["kimi-gateway"]["SMOKE"] == "not yet"


def test_a_release_other_than_the_plans_is_marked_and_said_under_the_table(recipe: Recipe, prod: Inventory) -> None:
    deploy, todo = planned(recipe, prod, "b300-01")
    found = serving(todo)
    older = "/opt/kimi/releases/0123456789abcdef"
    found["current"] = older
    found["releases"]["records"][older] = found["releases"]["records"].pop(todo.release.dir)  # type: ignore[index]
    text = format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW)
    assert table(text)[0]["RELEASE"].endswith("(0123456789ab) *")
    assert f"b300-01: * serves {older}, not the plan's {todo.release.dir}: a converge puts the plan's in place" in text
    found["current"] = None
    assert table(format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW))[0]["RELEASE"] == "none"


def test_a_host_not_probed_has_a_row_and_its_reason_escaped(recipe: Recipe, prod: Inventory) -> None:
    down = status(recipe, prod, "b300-02", error="Could not connect\x1b[2J (\u202etimeout)")
    text = format_status([status(recipe, prod, "b300-01"), down], now=NOW)
    row = next(r for r in table(text) if r["HOST"] == "b300-02")
    assert (row["STATE"], row["UNIT"], row["RELEASE"]) == ("not probed", "-", "-")
    assert "b300-02: not probed: Could not connect\\x1b[2J (\\u202etimeout)" in text
    assert "\x1b" not in text
    assert "\u202e" not in text


def test_what_a_host_wrote_reaches_the_terminal_escaped_and_bounded(recipe: Recipe, prod: Inventory) -> None:
    deploy, todo = planned(recipe, prod, "b300-01")
    found = serving(todo)
    record = found["releases"]["records"][todo.release.dir]  # type: ignore[index]
    assert record is not None
    record["record"] |= {"engine": "\x1b]0;owned\x07vllm", "engine_version": "9" * 10_000, "revision": 7}
    found["units"]["kimi-vllm"] |= {"sub": "running\u202e\n", "since": cast(float, "yesterday")}
    text = format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW)
    row = table(text)[0]
    assert row["RELEASE"].startswith("\\x1b]0;owned\\x07vllm 99999999999999999999...")
    assert len(row["RELEASE"]) < 100
    assert row["REVISION"] == "?"
    assert (row["STATE"], row["SINCE"]) == ("active (running\\u202e\\n)", "-")
    assert not any(c in text for c in "\x1b\x07\u202e")


def test_the_watchdogs_state_of_an_engine_and_what_it_did_since_the_release_started(
    recipe: Recipe, prod: Inventory
) -> None:
    deploy, todo = planned(recipe, prod, "b300-01")
    found = serving(todo)
    found["watchdog"] = {
        "updated": NOW - 3,
        "units": {"kimi-vllm": {"state": "drained", "since": NOW - 90, "why": "canary: HTTP 500\x1b[0m"}},
        "actions": [{"unit": "kimi-vllm", "action": "stop", "at": NOW - 90, "why": "canary: HTTP 500"}],
    }
    text = format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW)
    assert table(text)[0]["WATCHDOG"] == "drained, 1 min ago"
    notes = [line for line in text.splitlines() if line.startswith("b300-01: watchdog: ")]
    assert notes == [
        "b300-01: watchdog: kimi-vllm drained since 2026-09-21 14:11:50 UTC: 'canary: HTTP 500\\x1b[0m'",
        "b300-01: watchdog: kimi-vllm drained at 2026-09-21 14:11:50 UTC: 'canary: HTTP 500'",
    ]
    # a file its watchdog stopped writing: no state of its is current
    assert isinstance(found["watchdog"], dict)
    found["watchdog"]["updated"] = NOW - 3600
    assert table(format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW))[0]["WATCHDOG"] == "not running"


def test_the_benchmark_figures_kept_with_the_release_serving_are_shown_per_level(
    recipe: Recipe, prod: Inventory
) -> None:
    deploy, todo = planned(recipe, prod, "b300-01")
    levels = [
        {"concurrency": 1, "ttft_p50_s": 0.05, "output_tok_s": 120.25, "success_rate": 1.0},
        {"concurrency": 16, "ttft_p50_s": 0.4, "output_tok_s": 910.0, "success_rate": 0.6},
        {"concurrency": "sixteen", "ttft_p50_s": 1},
        {"concurrency": 32, "ttft_p50_s": True, "output_tok_s": "fast"},
    ]
    bench = {"release": "x", "at": "2026-09-21T11:00:00Z", "figures": {"targets": {"local": levels}}}
    text = format_status([HostStatus("b300-01", deploy, todo, serving(todo, bench=bench))], now=NOW)
    assert text.split("Benchmark of the release serving:\n", 1)[1].splitlines()[0] == (
        "  b300-01 (2026-09-21T11:00:00Z), local: at 1: TTFT p50 0.050 s, 120.2 tok/s, 100% ok; "
        "at 16: TTFT p50 0.400 s, 910.0 tok/s, 60% ok; at 32: no figures"
    )
    # none kept, or kept in another shape: nothing said
    shapes: list[object] = [None, {"figures": []}, {"figures": {"targets": {"local": "fast"}}}]
    for kept in shapes:
        assert "Benchmark" not in format_status(
            [HostStatus("b300-01", deploy, todo, serving(todo, bench=kept))], now=NOW
        )


def test_the_endpoint_is_the_router_hosts_gateway_and_the_curl_reads_the_key_from_the_environment(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIMI_API_KEY", "sk-never-printed")
    hosts = [status(recipe, prod, name) for name in ("gb300-p01", "gb300-d01", "gb300-rt01")]
    text = format_status(hosts, now=NOW)
    served = text.split("Endpoints:\n", 1)[1]
    assert served.splitlines()[0] == "  gb300-pd: http://10.41.0.50:8000 (gb300-rt01)"
    assert "\n".join(served.splitlines()[1:]) == (
        "    curl -sS \\\n"
        "        -H @<(printf 'Authorization: Bearer %s\\n' \"$KIMI_API_KEY\") \\\n"
        "        -H 'Content-Type: application/json' \\\n"
        f'        -d \'{{"model": "{recipe.model.served_name}", "messages": [{{"role": "user", "content": '
        f'"{recipe.smoke.prompt}"}}]}}\' \\\n'
        "        http://10.41.0.50:8000/v1/chat/completions"
    )
    assert "sk-never-printed" not in text


def test_a_key_file_is_read_by_the_shell_and_an_unexposed_engine_is_reached_on_its_host(
    recipe: Recipe, prod: Inventory
) -> None:
    topology = recipe.topologies["gb300-pd"]
    assert topology.expose is not None
    hostile = "/etc/kimi keys/it's $(reboot).key"
    expose = topology.expose.model_copy(update={"api_key": SecretRef(file=hostile)})
    changed = recipe.model_copy(
        update={"topologies": {**recipe.topologies, "gb300-pd": topology.model_copy(update={"expose": expose})}}
    )
    text = format_status([status(changed, prod, "gb300-rt01"), status(recipe, prod, "b300-01")], now=NOW)
    assert "-H @<(printf 'Authorization: Bearer %s\\n' \"$(cat '/etc/kimi keys/it'\"'\"'s $(reboot).key')\")" in text
    single = text.split("  single-node: ", 1)[1].splitlines()
    assert single[0] == "http://127.0.0.1:8000 (b300-01, from that host alone)"
    assert single[1] == "    # on b300-01: its API listens on loopback alone"
    # a topology served on loopback checks no key: none is sent
    assert single[2] == "    curl -sS \\"
    assert single[3] == "        -H 'Content-Type: application/json' \\"
    assert single[5] == "        http://127.0.0.1:8000/v1/chat/completions"


def test_ago_says_the_largest_unit() -> None:
    assert [ago(s) for s in (-5, 0.5, 45, 60, 3599, 7200, 3 * 86400)] == [
        "just now",
        "just now",
        "45 s ago",
        "1 min ago",
        "59 min ago",
        "2 h ago",
        "3 d ago",
    ]


def test_the_cold_start_kept_with_the_release_serving_is_shown_by_phase(recipe: Recipe, prod: Inventory) -> None:
    deploy, todo = planned(recipe, prod, "b300-01")
    kept = {
        "release": "r",
        "at": "2026-12-07T10:00:00Z",
        "run": "20261207T095800Z-ab12cd34",
        "seconds": {"release install": 37.2, "weights": 5.04, "units and start": 2.0, "smoke": 14.9, "bogus": 9},
        "to_serving": 59.1,
        "engine": {"kimi-vllm": {"compile": 18.4, "engine load": 0.0, "ready": 46.3}},
    }
    found = serving(todo, cold_start=kept)
    text = format_status([HostStatus("b300-01", deploy, todo, found)], now=NOW)
    assert "Cold start of the release serving:\n" in text
    assert (
        "  b300-01 (2026-12-07T10:00:00Z): 59 s to serving; "
        "release install 37 s, weights 5.0 s, units and start 2.0 s, smoke 15 s; "
        "kimi-vllm: compile 18 s, engine load 0.0 s, ready 46 s\n"
    ) in text
    # a host's hostile or half record says nothing rather than something wrong
    for bad in ({"seconds": "x", "to_serving": 1}, {"seconds": {"weights": "1"}, "to_serving": 1}, "text"):
        quiet = format_status([HostStatus("b300-01", deploy, todo, serving(todo, cold_start=bad))], now=NOW)
        assert "Cold start" not in quiet
