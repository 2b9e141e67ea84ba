"""The watchdog (``hostside/watchdog.py``): its recovery ladder, its canary against a served chat
API, its reading of the GPUs, its metrics, what the converge writes for it on each host, and what
the next converge tells of it (``kimi_deploy.serving.watchdog_report``).

The end-to-end run on real hosts, with real vLLM engines, is in tests/e2e/test_demo_watchdog.py.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from harness.hosted_api import HostedApi
from kimi_deploy.hostside import watchdog
from kimi_deploy.hostside.watchdog import Canary, Ladder, accelerators, canary
from kimi_deploy.inventory import Inventory
from kimi_deploy.recipe import Recipe
from kimi_deploy.serving.watchdog_report import release_time, watchdog_lines
from localcluster.fake_nvidia import describe
from tests.conftest import RECIPE
from tests.host_converge import LOCK, host_converge, lock_stands_in
from tests.hostile_http import (
    ENDLESS,
    LONG_LINE,
    NESTED,
    NOT_HTTP,
    Hostile,
    answer,
    unanswered,
    within,
)
from tests.loopback import serving
from tests.test_host_profile import make_bin
from tests.test_smoke import Engine

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

LADDER = {"restart_after": 3, "restarts": 1}
FAILED = "canary: HTTP 500"
WRONG = "canary: wrong answer: 'x', not 'READY'"


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []
    monkeypatch.setattr(watchdog, "log", said.append)
    return said


def test_the_ladder_restarts_after_failed_checks_in_a_row_then_drains(_quiet: list[str]) -> None:  # noqa: PT019  # noqa: PT019
    ladder = Ladder("kimi-vllm", LADDER)
    # two failures, then an answer: no action, and the count starts again
    assert [ladder.step(t, FAILED, None, None) for t in (1, 2)] == [None, None]
    assert ladder.state == "failing"
    assert ladder.step(3, None, None, None) is None
    assert ladder.state == "serving"
    assert [ladder.step(t, FAILED, None, None) for t in (4, 5, 6)] == [None, None, "restart"]
    assert ladder.state == "restarting"
    # while it starts again its failed checks do not count
    assert [ladder.step(t, "health: connection refused", "starting", None) for t in (7, 8, 9, 10)] == [None] * 4
    # it comes back answering wrong: after one restart (the recipe's), it is drained
    assert [ladder.step(t, FAILED, None, None) for t in (11, 12, 13)] == [None, None, "stop"]
    assert ladder.state == "drained"
    assert ladder.step(14, "unit inactive (dead)", "stopped", None) is None
    assert ladder.state == "drained"
    assert _quiet == [
        f"kimi-vllm: serving again (was failing: {FAILED})",
        f"kimi-vllm: {FAILED} (3 checks in a row): restarting (1 of 1)",
        f"kimi-vllm: {FAILED} after 1 restarts: draining (stopped; the router's health checks take it out)",
    ]
    # started again (by a converge) and answering: serving, its restarts counted anew
    assert ladder.step(15, None, None, None) is None
    assert (ladder.state, ladder.restarts) == ("serving", 0)


def test_wrong_answers_drain_without_a_restart(_quiet: list[str]) -> None:  # noqa: PT019
    # restarted, an engine that answers wrong would rejoin the router on its /health at once
    ladder = Ladder("kimi-vllm", LADDER)
    assert [ladder.step(t, WRONG, None, None) for t in (1, 2, 3)] == [None, None, "stop"]
    assert (ladder.state, ladder.restarts, ladder.why) == ("drained", 0, WRONG)
    assert _quiet == [
        f"kimi-vllm: {WRONG} (3 checks in a row): draining (stopped; the router's health checks take it out)"
    ]
    # a wrong answer among errors: the ladder goes by the check that reached the rung
    mixed = Ladder("kimi-vllm", LADDER)
    assert [mixed.step(t, why, None, None) for t, why in ((1, WRONG), (2, WRONG), (3, FAILED))] == [
        None,
        None,
        "restart",
    ]


@pytest.mark.usefixtures("_quiet")
def test_a_host_fault_drains_after_as_many_checks_and_a_stop_on_purpose_is_left_alone() -> None:
    ladder = Ladder("kimi-vllm", LADDER)
    assert ladder.step(1, "unit inactive (dead)", "stopped", None) is None
    assert ladder.state == "stopped"
    lost = "accelerators: 7 of 8 GPUs answer nvidia-smi"
    other = Ladder("kimi-vllm", LADDER)
    # checked as often as a failed answer is (a misread is no reason to stop serving), never restarted
    assert [other.step(t, None, "starting", lost) for t in (1, 2, 3)] == [None, None, "stop"]
    assert (other.state, other.why) == ("drained", lost)
    assert other.step(4, None, None, None) is None  # the host is whole again and it answers
    assert other.state == "serving"


def test_the_ladder_carries_its_state_across_a_restart_of_the_watchdog() -> None:
    ladder = Ladder("kimi-vllm", LADDER)
    for t in (1, 2, 3):
        ladder.step(t, FAILED, None, None)
    again = Ladder("kimi-vllm", LADDER, json.loads(json.dumps(ladder.record())))
    assert (again.state, again.restarts, again.why) == ("restarting", 1, FAILED)
    assert [again.step(t, FAILED, None, None) for t in (4, 5, 6)] == [None, None, "stop"]


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    api = HostedApi("127.0.0.1", "sk-engine", answers={"Say READY.": "READY", "Say garbage.": "kjh#@!"})
    key = tmp_path / "kimi-vllm.env"
    key.write_text("VLLM_API_KEY=sk-engine\n", encoding="utf-8")
    yield api, str(key)
    api.close()


def _unit(url: str, prompt: str, key_file: str) -> dict[str, Any]:
    return {
        "unit": "kimi-vllm",
        "url": url,
        "served_name": "kimi",
        "prompt": prompt,
        "expect": "READY",
        "max_tokens": 8,
        "key_file": key_file,
        "key_var": "VLLM_API_KEY",
    }


def test_the_canary_passes_a_right_answer_and_fails_a_wrong_one_with_a_200(engine: Any) -> None:
    api, key = engine
    why, took = canary(_unit(api.url, "Say READY.", key), 5)
    assert why is None
    assert took > 0
    assert api.seen[-1]["authorization"] == "Bearer sk-engine"
    assert api.seen[-1]["body"]["messages"] == [{"role": "user", "content": "Say READY."}]
    assert canary(_unit(api.url, "Say garbage.", key), 5)[0] == "canary: wrong answer: 'kjh#@!', not 'READY'"
    assert canary(_unit(api.url, "Say READY.", "/nonexistent"), 5)[0] == "canary: HTTP 401"
    api.close()
    assert canary(_unit(api.url, "Say READY.", key), 5)[0] == f"canary: engine at {api.url[7:]}: Connection refused"


def _news(c: Canary, due: bool = False) -> str | bool | None:
    """The canary's next news, waiting for one that was sent to come back."""
    deadline = time.monotonic() + 10
    news = c.news(due)
    while news is False and c.started is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        news = c.news(due)
    return news


def test_the_canary_goes_out_on_its_own_cadence_and_every_round_while_it_fails(engine: Any) -> None:
    api, key = engine
    good = Canary(_unit(api.url, "Say READY.", key), interval_s=3600, timeout_s=5)
    assert _news(good) is None  # sent, and back: it passed
    sent = len(api.seen)
    assert good.news(False) is False  # not due again for an hour
    assert len(api.seen) == sent
    bad = Canary(_unit(api.url, "Say garbage.", key), interval_s=3600, timeout_s=5)
    assert _news(bad) == "canary: wrong answer: 'kjh#@!', not 'READY'"
    assert _news(bad) == "canary: wrong answer: 'kjh#@!', not 'READY'"  # failing: sent again at once


def test_a_canary_not_back_in_time_fails_without_holding_the_round() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        slow = Canary(_unit(url, "Say READY.", "/nonexistent"), interval_s=3600, timeout_s=0.5)
        started = time.monotonic()
        assert slow.news(False) is False
        assert time.monotonic() - started < 0.5  # the round goes on
        time.sleep(0.7)
        assert slow.news(False) == "canary: no answer in 0.5 s"


def _smi(tmp_path: Path, output: str, status: int = 0) -> None:
    """An ``nvidia-smi`` on PATH that prints ``output`` and exits ``status``."""
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\nexit {status}\n", encoding="utf-8")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_the_gpus_are_counted_and_their_uncorrected_errors_summed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    # as an H100 on 590.48.01 answers (utkuozdemir/nvidia_gpu_exporter internal/captures): pages are
    # not retired on it, rows are remapped
    rows = "".join(f"{i}, 00000000:{0x18 + i:02X}:00.0, 0, [N/A], No\n" for i in range(8))
    _smi(tmp_path, rows)
    assert accelerators({"count": 8}, 5) == {"count": 8, "ecc": 0, "pending": 0, "fault": None}
    _smi(tmp_path, rows.replace("3, 00000000:1B:00.0, 0, [N/A], No", "3, 00000000:1B:00.0, 2, [N/A], Yes"))
    assert accelerators({"count": 8}, 5) == {"count": 8, "ecc": 2, "pending": 1, "fault": "2 uncorrected ECC errors"}
    lost = "Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error\n"
    _smi(tmp_path, lost + "".join(r for r in rows.splitlines(keepends=True) if not r.startswith("3,")), 15)
    found = accelerators({"count": 8}, 5)
    assert found["count"] == 7
    assert found["fault"] == f"7 of 8 GPUs answer nvidia-smi ({lost.strip()})"
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert accelerators({"count": 8}, 5)["fault"].startswith("nvidia-smi: ")


@pytest.mark.parametrize(
    ("state", "status", "fault"),
    [
        ("Completed", "Success", None),  # an H200 on 590.48.01 (nvidia_gpu_exporter's capture)
        ("N/A", "N/A", None),  # a GPU without a fabric (an L40S on 595.80, same source)
        ("Completed", "Insufficient Resources", "GPU 00000000:1B:00.0: fabric Completed, Insufficient Resources"),
        ("In Progress", "N/A", "GPU 00000000:1B:00.0: fabric In Progress"),
    ],
)
def test_a_gpu_its_nvlink_fabric_has_not_joined_is_a_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str, status: str, fault: str | None
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    rows = [f"{i}, 00000000:{0x18 + i:02X}:00.0, 0, [N/A], No, Completed, Success\n" for i in range(8)]
    rows[3] = f"3, 00000000:1B:00.0, 0, [N/A], No, {state}, {status}\n"
    _smi(tmp_path, "".join(rows))
    assert accelerators({"count": 8}, 5)["fault"] == fault


def test_a_driver_that_refuses_the_fabric_fields_is_asked_without_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    tool = tmp_path / "nvidia-smi"
    # as nvidia-smi answers a field its driver does not know: the message, exit 2 (NVML's invalid argument)
    tool.write_text(
        '#!/bin/sh\ncase "$1" in *fabric*) echo \'Field "fabric.state" is not a valid field to query.\'; exit 2;; esac\n'
        "echo '0, 00000000:18:00.0, 1, No, [N/A]'\n",
        encoding="utf-8",
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert accelerators({"count": 1}, 5) == {"count": 1, "ecc": 1, "pending": 0, "fault": "1 uncorrected ECC errors"}


def _recipe_converge(monkeypatch: pytest.MonkeyPatch, recipe: Recipe, prod: Inventory, host: str) -> Any:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    return host_converge(recipe, prod, host)


def test_each_engine_host_gets_a_watchdog_of_its_engines_and_a_router_host_none(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    todo = _recipe_converge(monkeypatch, recipe, prod, "gb300-p01")
    files = {f.path: f for f in todo.files}
    config = json.loads(files["/etc/kimi/kimi-watchdog.json"].content)
    assert [u["unit"] for u in config["units"]] == ["kimi-vllm"]
    check = next(u for u in todo.units if u.name == "kimi-vllm").smoke
    assert check is not None
    assert config["units"][0]["url"] == check.url
    assert config["units"][0]["key_file"] == check.request["key_file"]
    assert config["accelerators"] == {"vendor": "nvidia", "count": 4}
    assert config["scrub"] is not None
    assert config["scrub"].endswith("/.kimi/scrub.json")
    unit = files["/etc/systemd/system/kimi-watchdog.service"].content
    assert "ExecStart=/usr/bin/python3 /opt/kimi/tools/kimi-watchdog.py --config /etc/kimi/kimi-watchdog.json" in unit
    # on a GPU host it reads the kernel's log (Xid events): CAP_SYSLOG alone, kernel logs open
    assert "CapabilityBoundingSet=CAP_SYSLOG\n" in unit
    assert "ProtectKernelLogs" not in unit
    assert config["kmsg"] == "/dev/kmsg"
    assert config["xid_ignore"] == [13, 31, 43, 45, 68, 109]
    assert "NoNewPrivileges=yes" in unit
    # no key in any of its files
    assert not any("sk-kimi-d41c9a0e77b2" in f.content for p, f in files.items() if "watchdog" in p)
    watchdog_unit = next(u for u in todo.units if u.name == "kimi-watchdog")
    assert watchdog_unit.stage == 4
    assert watchdog_unit.smoke is None
    router = _recipe_converge(monkeypatch, recipe, prod, "gb300-rt01")
    assert not any("watchdog" in f.path for f in router.files)
    assert "kimi-watchdog" not in [u.name for u in router.units]


def test_without_a_watchdog_in_the_recipe_no_host_gets_one(
    recipe: Recipe, prod: Inventory, monkeypatch: pytest.MonkeyPatch
) -> None:
    todo = _recipe_converge(monkeypatch, recipe.model_copy(update={"watchdog": None}), prod, "gb300-p01")
    assert not any("watchdog" in f.path for f in todo.files)


NOW = 1_800_000_000.0


def _state(**units: dict[str, Any]) -> dict[str, Any]:
    return {"updated": NOW - 2, "units": units, "actions": []}


def test_the_report_names_a_unit_not_serving_and_what_was_done_since_the_release() -> None:
    found = _state(**{"kimi-vllm": {"state": "drained", "since": NOW - 60, "why": FAILED}})
    found["actions"] = [
        {"at": NOW - 7200, "unit": "kimi-vllm", "action": "restart", "why": "before the release"},
        {"at": NOW - 120, "unit": "kimi-vllm", "action": "restart", "why": FAILED},
        {"at": NOW - 60, "unit": "kimi-vllm", "action": "stop", "why": FAILED},
    ]
    lines = watchdog_lines(found, ["kimi-vllm"], since=NOW - 3600, interval_s=5, now=NOW)
    assert lines == [
        f"kimi-vllm drained since 2027-01-15 07:59:00 UTC: {FAILED!r}",
        f"kimi-vllm restarted at 2027-01-15 07:58:00 UTC: {FAILED!r}",
        f"kimi-vllm drained at 2027-01-15 07:59:00 UTC: {FAILED!r}",
    ]
    assert (
        watchdog_lines(_state(**{"kimi-vllm": {"state": "serving"}}), ["kimi-vllm"], since=None, interval_s=5, now=NOW)
        == []
    )


def test_the_report_reads_a_hostile_state_file_as_bounded_text() -> None:
    assert watchdog_lines(None, ["kimi-vllm"], since=None, interval_s=5, now=NOW) == ["not running: no state file yet"]
    stale = {"updated": NOW - 3600, "units": "x", "actions": {}}
    assert watchdog_lines(stale, ["kimi-vllm"], since=None, interval_s=5, now=NOW) == [
        "not running: its last round was 2027-01-15 07:00:00 UTC"
    ]
    hostile = _state(**{"kimi-vllm": {"state": "drained", "since": "x", "why": "a\nExecStartPre=+/bin/sh" + "y" * 500}})
    hostile["actions"] = [{"at": True, "unit": "kimi-vllm", "action": "stop"}, {"unit": "other", "action": "stop"}, 7]
    [line] = watchdog_lines(hostile, ["kimi-vllm"], since=None, interval_s=5, now=NOW)
    assert line.startswith("kimi-vllm drained: 'a\\nExecStartPre=+/bin/sh")
    assert "\n" not in line
    assert len(line) < 200


def test_the_release_log_time_is_read_and_a_bad_one_is_none() -> None:
    assert release_time(["2027-01-15T08:00:00Z", "/opt/kimi/releases/x", "serving"]) == NOW
    assert release_time(None) is None
    assert release_time(["yesterday"]) is None


def test_the_recipe_example_keeps_the_default_ladder(recipe: Recipe) -> None:
    assert recipe.watchdog is not None
    assert (recipe.watchdog.restart_after, recipe.watchdog.restarts) == (3, 1)
    assert RECIPE.endswith(".yaml")


def test_a_lost_gpu_and_uncorrected_errors_of_the_cluster_s_gpus_are_faults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the local cluster's nvidia-smi, with its fault knobs set as a drill sets them: the
    watchdog reads what it would read from the real tool in that state (``_smi`` above)."""
    bin_dir = make_bin(tmp_path, tools=False)
    described = describe("h200x8", "test-host")
    config = tmp_path / "fake-accelerators.json"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KIMI_FAKE_ACCELERATORS", str(config))
    config.write_text(json.dumps(described), encoding="utf-8")
    assert accelerators({"count": 8}, 10) == {"count": 8, "ecc": 0, "pending": 0, "fault": None}
    described["gpus"][2]["ecc_uncorrected_volatile"] = 3
    config.write_text(json.dumps(described), encoding="utf-8")
    assert accelerators({"count": 8}, 10)["fault"] == "3 uncorrected ECC errors"
    described["gpus"][2] = {
        **described["gpus"][2],
        "ecc_uncorrected_volatile": 0,
        "fabric_status": "Insufficient Resources",
    }
    config.write_text(json.dumps(described), encoding="utf-8")
    bus = described["gpus"][2]["pci_bus_id"]
    assert accelerators({"count": 8}, 10)["fault"] == f"GPU {bus}: fabric Completed, Insufficient Resources"
    described["gpus"][2] = {**described["gpus"][2], "fabric_status": "Success", "lost": True}
    config.write_text(json.dumps(described), encoding="utf-8")
    bus = described["gpus"][2]["pci_bus_id"]
    assert accelerators({"count": 8}, 10)["fault"] == (
        f"7 of 8 GPUs answer nvidia-smi (Unable to determine the device handle for GPU{bus[4:]}: Unknown Error)"
    )


def test_a_host_fault_is_judged_every_round_even_with_no_canary_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A healthy engine whose canary is not due (its interval is an hour) is drained all the same
    when its host loses a GPU: the host's fault counts each round, not each canary."""
    engine = Engine()
    engine.reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "READY"}}]}
    acted: list[tuple[str, str]] = []
    monkeypatch.setattr(watchdog.Watchdog, "_act", lambda self, unit, action, why, now: acted.append((unit, action)))
    for _ in serving(engine):  # the engine serves for the loop's one turn
        unit = _unit(f"http://127.0.0.1:{engine.server_address[1]}", "Say READY.", "/nonexistent")
        config = {
            **LADDER,
            "restart_after": 2,
            "canary_interval_s": 3600,
            "canary_timeout_s": 10,
            "grace_s": 0,
            "timeout_s": 5,
            "state": str(tmp_path / "state.json"),
            "units": [unit],
        }
        dog = watchdog.Watchdog(config)
        running = {"ActiveState": "active", "ExecMainStartTimestampMonotonic": "1", "NRestarts": "0"}
        lost = "accelerators: 7 of 8 GPUs answer nvidia-smi"
        dog._unit(unit, running, {}, None, 1.0)  # the first canary goes out
        _news(dog.canaries["kimi-vllm"])  # and comes back: serving, the next one due in an hour
        dog._unit(unit, running, {}, lost, 2.0)
        assert acted == []
        dog._unit(unit, running, {}, lost, 3.0)
    assert acted == [("kimi-vllm", "stop")]


# ---- whatever answers on an engine's port ----------------------------------------------------------------

CHAT_READY = answer({"choices": [{"index": 0, "message": {"role": "assistant", "content": "READY"}}]})
SERVES = {"/health": answer(b""), "/v1/chat/completions": CHAT_READY}


def _dog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *urls: str
) -> tuple[watchdog.Watchdog, list[tuple[str, str]]]:
    """A watchdog of one unit a URL (``kimi-0``, ``kimi-1``...), all of them running; its actions recorded."""
    units = [_unit(url, "Say READY.", "/nonexistent") | {"unit": f"kimi-{i}"} for i, url in enumerate(urls)]
    running = {"ActiveState": "active", "SubState": "running", "ExecMainStartTimestampMonotonic": "1", "NRestarts": "0"}
    monkeypatch.setattr(watchdog, "systemd", lambda names: dict.fromkeys(names, running))
    acted: list[tuple[str, str]] = []
    monkeypatch.setattr(watchdog.Watchdog, "_act", lambda self, unit, action, why, now: acted.append((unit, action)))
    config = {
        "restart_after": 1,
        "restarts": 1,
        "canary_interval_s": 3600,
        "canary_timeout_s": 2,
        "grace_s": 0,
        "timeout_s": 1,
        "state": str(tmp_path / "state.json"),
        "textfile": None,
        "units": units,
    }
    return watchdog.Watchdog(config), acted


def _rounds(dog: watchdog.Watchdog, rounds: int) -> None:
    for _ in range(rounds):
        dog.round()


@unanswered("/health", "no whole answer in 1 s")
def test_a_check_answered_by_something_else_fails_in_one_line_and_the_next_round_checks_the_other_unit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    _quiet: list[str],  # noqa: PT019
    sent: bytes,
    endless: tuple[str, ...],
    said: str,
) -> None:
    bad, good = Hostile(default=sent, endless=endless), Hostile(SERVES)
    try:
        dog, acted = _dog(tmp_path, monkeypatch, bad.url, good.url)
        within(20, lambda: _rounds(dog, 2))
    finally:
        bad.close()
        good.close()
    assert acted[0] == ("kimi-0", "restart")
    assert next(line for line in _quiet if line.startswith("kimi-0")) == (
        f"kimi-0: health: engine at 127.0.0.1:{bad.port}: {said} (1 checks in a row): restarting (1 of 1)"
    )
    assert good.asked.count("/health") == 2  # the other unit, checked in both rounds
    assert dog.ladders["kimi-1"].state == "serving"
    assert not any(unit == "kimi-1" for unit, _ in acted)


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (
            NOT_HTTP,
            "canary: engine at 127.0.0.1:{port}: not HTTP: status line 'SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13'",
        ),
        (LONG_LINE, "canary: engine at 127.0.0.1:{port}: not HTTP: a header line over 65536 bytes"),
        (answer(b"x" * (2 << 20)), "canary: engine at 127.0.0.1:{port}: an answer over 1048576 bytes"),
        (ENDLESS, "canary: engine at 127.0.0.1:{port}: no whole answer in 2 s"),
        (
            NESTED,
            f"{watchdog.WRONG} not a chat completion (engine at 127.0.0.1:{{port}}: JSON nested deeper than 32 levels)",
        ),
        (answer(b"\xff[1]"), f"{watchdog.WRONG} not a chat completion (engine at 127.0.0.1:{{port}}: not JSON: "),
    ],
    ids=["not-http", "long-line", "too-long", "endless-body", "nested-json", "not-json"],
)
def test_a_hostile_canary_answer_fails_the_canary_with_its_reason(sent: bytes, said: str) -> None:
    server = Hostile(default=sent, endless=("/v1/chat/completions",) if sent == ENDLESS else ())
    try:
        why, _ = within(10, lambda: canary(_unit(server.url, "Say READY.", "/nonexistent"), 2))
    finally:
        server.close()
    assert why is not None
    assert why.startswith(said.format(port=server.port))
    assert "\n" not in why


def test_the_canary_thread_outlives_a_nested_answer_and_says_why_it_failed() -> None:
    server = Hostile(default=NESTED)
    try:
        sent = Canary(_unit(server.url, "Say READY.", "/nonexistent"), interval_s=3600, timeout_s=5)
        news = within(10, lambda: _news(sent))
    finally:
        server.close()
    assert (
        news
        == f"{watchdog.WRONG} not a chat completion (engine at 127.0.0.1:{server.port}: JSON nested deeper than 32 levels)"
    )


def test_an_unexpected_error_in_one_check_is_one_line_and_the_rounds_go_on(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    _quiet: list[str],  # noqa: PT019
) -> None:
    good = Hostile(SERVES)
    checked = watchdog.health

    def health(unit: dict[str, Any], timeout: float) -> str | None:
        if unit["unit"] == "kimi-0":
            raise RecursionError("maximum recursion depth exceeded")
        return checked(unit, timeout)

    monkeypatch.setattr(watchdog, "health", health)
    try:
        dog, acted = _dog(tmp_path, monkeypatch, good.url, good.url)
        within(20, lambda: _rounds(dog, 3))
    finally:
        good.close()
    assert [line for line in _quiet if line.startswith("kimi-0")] == [
        "kimi-0: the check failed unexpectedly (RecursionError: maximum recursion depth exceeded): not judged this round"
    ]
    assert good.asked.count("/health") == 3  # kimi-1, every round
    assert acted == []
    assert set(json.loads((tmp_path / "state.json").read_text())["units"]) == {"kimi-0", "kimi-1"}


def test_an_unexpected_error_in_the_canary_thread_is_a_failed_canary_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(unit: dict[str, Any], timeout: float) -> tuple[str | None, float]:
        raise KeyError("choices")

    monkeypatch.setattr(watchdog, "canary", broken)
    sent = Canary(_unit("http://127.0.0.1:9", "Say READY.", "/nonexistent"), interval_s=3600, timeout_s=5)
    assert within(10, lambda: _news(sent)) == "canary: failed unexpectedly: KeyError: 'choices'"
