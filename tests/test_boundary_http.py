"""The checks of what clients and peers send (hostside/boundary_http.py, hostside/boundary_json.py),
fuzzed: whatever arrives, the answer is a checked value or one refusal line, never an exception."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hostside.boundary_http import MAX_HEADERS, Refused, parse_head
from hostside.boundary_json import depth, loads


def _refusal(check: Callable[[], object]) -> ValueError | None:
    """The refusal ``check`` raises, or None when it accepts."""
    try:
        check()
    except ValueError as exc:
        return exc
    return None


@pytest.mark.parametrize(
    ("lines", "status", "message"),
    [
        ([b"GET / HTTP/2.0\r\n"], 505, "only HTTP/1.0 and HTTP/1.1 are served"),
        ([b"GET  / HTTP/1.1\r\n"], 400, "not METHOD SP TARGET SP VERSION"),
        ([b"get / HTTP/1.1\r\n"], 400, "not METHOD SP TARGET SP VERSION"),
        ([b"GET / HTTP/1.1\r\n", b"Content-Length: 5\r\n", b"Content-Length: 6\r\n"], 400, "given more than once"),
        ([b"GET / HTTP/1.1\r\n", b"Content-Length: +5\r\n"], 400, "is not a number of bytes"),
        ([b"GET / HTTP/1.1\r\n", b"Authorization: Bearer a\r\n", b" b\r\n"], 400, "folded header lines"),
        ([b"GET / HTTP/1.1\r\n", b"Bad Name: x\r\n"], 400, "not NAME: VALUE"),
        ([b"GET / HTTP/1.1\r\n", b"X-A: a\x00b\r\n"], 400, "control character"),
    ],
)
def test_a_head_breaking_a_rule_is_refused_naming_it(lines: list[bytes], status: int, message: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_head(lines)
    assert refused.value.status == status
    assert message in str(refused.value)


def test_a_head_within_the_rules_reads_back() -> None:
    lines = [b"POST /v1/completions HTTP/1.1\r\n", b"Content-Length: 12\r\n", b"Accept: a\r\n", b"accept: b\r\n"]
    head = parse_head(lines + [b"X-%d: v\r\n" % i for i in range(MAX_HEADERS - 3)])
    assert (head.method, head.target, head.version, head.content_length) == ("POST", "/v1/completions", "HTTP/1.1", 12)
    assert head.get("ACCEPT") == "a, b"
    assert head.keep_alive
    assert head.has_body


@given(st.integers(min_value=0, max_value=200), st.text(alphabet='[]{}"\\ab', max_size=8))
def test_depth_is_counted_outside_strings(levels: int, text: str) -> None:
    doc: dict[str, object] = {"s": text}
    for _ in range(levels):
        doc = {"a": [doc]}
    assert depth(json.dumps(doc).encode()) == 1 + 2 * levels


@given(st.binary(max_size=200) | st.sampled_from([b"[" * 5000, b"{" * 5000, b'{"a":' * 3000, b"9" * 5000]))
@settings(max_examples=2000, deadline=None)
def test_whatever_a_peer_sends_decodes_or_is_one_refusal_line(data: bytes) -> None:
    refusal = _refusal(lambda: loads(data, "kimi-h2's message", max_bytes=4096, max_depth=8))
    if refusal is not None:
        assert type(refusal) is ValueError
        assert str(refusal).startswith("kimi-h2's message: ")
        assert str(refusal).isprintable()
