"""Every parser on every real capture, and on mutations of them: what it found, or one line.

Each parser, given any capture (its own command's or another's), returns plain JSON data or raises
:class:`~kimi_deploy.parsers.ParseError` with a one-line message; nothing else escapes. On its own
command's captures, an empty answer is allowed only where the capture is that command's valid empty
output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_deploy.parsers import ParseError
from kimi_deploy.parsers.ibstat import parse_ibstat
from kimi_deploy.parsers.ibv_devinfo import parse_ibv_devinfo
from kimi_deploy.parsers.nccl_tests import parse_nccl_tests
from kimi_deploy.parsers.nvidia_smi_fabric import parse_fabric
from kimi_deploy.parsers.nvidia_smi_query import parse_query
from kimi_deploy.parsers.nvidia_smi_topo import parse_topo
from kimi_deploy.parsers.tpu_pci import parse_tpu_pci
from tests.parsers import FIXTURES, fixture

# file-name prefix -> (parser, what it found: empty means nothing)
PARSERS: dict[str, tuple[Callable[[str], Any], Callable[[Any], int]]] = {
    "query_": (parse_query, len),
    "topo_": (parse_topo, lambda found: len(found["gpus"])),
    "fabric_": (parse_fabric, len),
    "ibv_devinfo_": (parse_ibv_devinfo, len),
    "ibstat_": (parse_ibstat, lambda found: len(found["cas"])),
    "tpu_": (parse_tpu_pci, lambda found: found["chip_count"] + len(found["devices"]) + len(found["nodes"])),
    "nccl_": (parse_nccl_tests, lambda found: len(found["rows"]) + len(found["ranks"])),
}
CAPTURES = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith(tuple(PARSERS)))
# A command's own empty output: the only captures its parser may answer with nothing.
VALID_EMPTY = {
    "ibv_devinfo_none_no_devices_driver_warnings_pib2.txt",  # "No IB devices found"
    "tpu_unknown_0chip_find_dev_vfio_gvisor10795.txt",  # /dev/vfio holding the container node alone
}


def _said(parse: Callable[[str], Any], text: str) -> tuple[Any, str | None]:
    """What ``parse`` found in ``text`` (JSON-able), or the line its ParseError said."""
    try:
        found = parse(text)
    except ParseError as error:
        return None, str(error)
    json.dumps(found)
    return found, None


def _own(name: str) -> tuple[Callable[[str], Any], Callable[[Any], int]]:
    return next(parser for prefix, parser in PARSERS.items() if name.startswith(prefix))


def test_the_corpus_holds_sixty_captures_and_more_across_the_kinds() -> None:
    by_kind = {prefix: sum(1 for n in CAPTURES if n.startswith(prefix)) for prefix in PARSERS}
    assert sum(by_kind.values()) >= 60, by_kind
    assert all(count >= 4 for count in by_kind.values()), by_kind


@pytest.mark.parametrize("name", CAPTURES)
def test_its_own_parser_finds_something_or_says_what_it_expected_in_one_line(name: str) -> None:
    parse, size = _own(name)
    found, said = _said(parse, fixture(name))
    if said is not None:
        assert said
        assert "\n" not in said
        return
    assert (size(found) == 0) == (name in VALID_EMPTY), found


@pytest.mark.parametrize("prefix", sorted(PARSERS))
def test_every_parser_reads_every_capture_as_data_or_one_line(prefix: str) -> None:
    parse, _ = PARSERS[prefix]
    for name in CAPTURES:
        _, said = _said(parse, fixture(name))
        assert "\n" not in (said or ""), name


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A capture with lines deleted or repeated, a span cut out, and characters changed."""
    lines = fixture(draw(st.sampled_from(CAPTURES))).split("\n")
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        if not lines:
            break
        at = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        if draw(st.booleans()):
            del lines[at]
        else:
            lines.insert(at, lines[at])
    text = "\n".join(lines)
    if text and draw(st.booleans()):
        start = draw(st.integers(min_value=0, max_value=len(text) - 1))
        text = text[:start] + text[start + draw(st.integers(min_value=1, max_value=200)) :]
    chars = list(text)
    for at in draw(st.lists(st.integers(min_value=0, max_value=max(len(chars) - 1, 0)), max_size=8)):
        if chars:
            chars[at] = draw(st.sampled_from([" ", "\t", ":", ",", "|", "[", "]", "0", "x", "\r", "\x1b", "é"]))
    return "".join(chars)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated(), prefix=st.sampled_from(sorted(PARSERS)))
def test_mutated_captures_parse_or_raise_one_line(text: str, prefix: str) -> None:
    parse, _ = PARSERS[prefix]
    _, said = _said(parse, text)
    assert "\n" not in (said or "")
