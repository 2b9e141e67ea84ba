"""Which release a host goes back to, from its release log (the latest converge undone)."""

from __future__ import annotations

from typing import Any

import pytest

from kimi_deploy.converge.rollback import RollbackError, latest_run, pins_line, plan_rollback

OLD, NEW = "/opt/kimi/releases/old", "/opt/kimi/releases/new"
RECORD = {
    "format": 2,
    "engine": "vllm",
    "engine_version": "0.34.0",
    "revision": "23eb01d77aab" + "0" * 28,
    "pins": {"engines.vllm.version": "0.34.0", "model.revision": "23eb01d77aab" + "0" * 28},
}
LOG = [
    ["t1", OLD, "switched", "r1"],
    ["t2", OLD, "serving", "r1"],
    ["t3", NEW, "switched", "r2"],
    ["t4", NEW, "serving", "r2"],
]


def whole(**kw: Any) -> dict[str, Any]:
    return {OLD: {"record": RECORD, "engine": True, "model": True, "files": True, **kw}}


def test_the_latest_converge_is_undone_on_the_hosts_it_switched() -> None:
    assert latest_run([LOG, LOG[:2]]) == "r2"
    plan = plan_rollback("h1", NEW, LOG, whole(), "r2")
    assert plan.target == OLD
    assert pins_line("h1", plan) == (
        "h1: back to vllm 0.34.0, weights 23eb01d77aab; to keep it, set in the recipe: "
        f"engines.vllm.version: 0.34.0, model.revision: {RECORD['revision']}"
    )


def test_a_host_the_latest_converge_left_alone_is_not_touched() -> None:
    plan = plan_rollback("h3", OLD, LOG[:2], whole(), "r2")
    assert plan.target is None
    assert plan.why == "h3: the latest converge did not change this host's release"


def test_a_release_that_never_served_is_not_a_target() -> None:
    log = [["t0", "/opt/kimi/releases/broken", "switched", "r0"], *LOG]
    assert plan_rollback("h1", NEW, log, whole(), "r2").target == OLD


def test_a_second_rollback_does_nothing() -> None:
    log = [*LOG, ["t5", OLD, "rolled-back", "r3"], ["t6", OLD, "serving", "r3"]]
    assert plan_rollback("h1", OLD, log, whole(), latest_run([log])).target is None


@pytest.mark.parametrize(
    ("records", "says"),
    [
        ({}, "h1: rollback target /opt/kimi/releases/old is no longer on this host"),
        (
            whole(engine=False),
            "h1: rollback target /opt/kimi/releases/old (vllm 0.34.0, weights 23eb01d77aab): its engine release is gone",
        ),
        (whole(model=False), "(vllm 0.34.0, weights 23eb01d77aab): its weights revision 23eb01d77aab is gone"),
        (whole(files=False), "the copies of its files are gone"),
    ],
)
def test_a_target_no_longer_whole_is_one_line_naming_what_is_gone(records: dict[str, Any], says: str) -> None:
    with pytest.raises(RollbackError) as caught:
        plan_rollback("h1", NEW, LOG, records, "r2")
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_nothing_served_before_is_nothing_to_roll_back_to() -> None:
    with pytest.raises(RollbackError, match="no earlier release served on this host"):
        plan_rollback("h1", NEW, LOG[2:], whole(), "r2")
