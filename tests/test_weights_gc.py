"""Revisions a host may delete once the planned one serves: all but it and the rollback copy."""

from __future__ import annotations

from kimi_deploy.weights.gc import collectable

A, B, C = "a" * 40, "b" * 40, "c" * 40


def test_an_upgrade_keeps_the_previous_revision_as_the_rollback_copy() -> None:
    assert collectable([A, B], [A], B) == []


def test_the_next_upgrade_collects_the_revision_before_the_previous_one() -> None:
    assert collectable([A, B, C], [A, B], C) == [A]


def test_a_rollback_keeps_the_revision_it_left() -> None:
    assert collectable([A, B, C], [A, B, C], B) == [A]


def test_a_revision_no_release_served_is_collected() -> None:
    # C was synced by a converge that failed before its release switched.
    assert collectable([A, B, C], [A, B], B) == [C]


def test_a_rollback_copy_already_gone_is_not_invented() -> None:
    assert collectable([B], [A, B], B) == []
    assert collectable([A, B], [B, B, B], B) == [A]
