"""How refusals show hostile values: bounded whatever their size, in ASCII, control characters named."""

from __future__ import annotations

import time

from kimi_deploy.hostside.boundary_text import control_char, shown


def test_a_huge_value_is_shown_cut_short_without_reading_all_of_it() -> None:
    assert shown("abc") == "'abc'"
    assert shown("x" * 10_000_000) == f"{'x' * 120!r}... (10000000 characters)"
    assert shown(10**5000) == "<an integer of about 5001 digits>"
    shared: list[object] = ["ha"] * 9
    for _ in range(9):  # a YAML alias bomb's shape: 9**10 items, shared
        shared = [shared] * 9
    started = time.process_time()
    text = shown(shared)
    assert len(text) <= 120
    assert time.process_time() - started < 1.0


def test_what_is_shown_is_ascii_so_no_control_or_bidi_character_reaches_a_terminal() -> None:
    text = shown("evil\u202e\x1b[2Jname\n")
    assert text.isascii()
    assert "\\u202e" in text
    assert "\\x1b" in text
    assert "\\n" in text


def test_control_characters_are_named_by_code_point() -> None:
    assert control_char("plain text with tabs? no") is None
    assert control_char("a\tb") == "U+0009"
    assert control_char("line\u2028separator") == "U+2028"
    assert control_char("c1\x85") == "U+0085"
    assert control_char("del\x7f") == "U+007F"
