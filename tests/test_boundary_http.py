"""The checks of what clients, peers and engines send (hostside/boundary_http.py,
hostside/boundary_json.py), fuzzed: whatever arrives, the answer is a checked value or one refusal
line, never an exception."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_deploy.hostside.boundary_http import MAX_HEADERS, Refused, Unanswered, ask, parse_head
from kimi_deploy.hostside.boundary_json import depth, loads
from tests.hostile_http import Hostile


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


# ---- what a host program reads of an engine's answer --------------------------------------------------------

_HEAD = st.sampled_from(
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.0 404 Not Found\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n",
        b"HTTP/2 200\r\n",
        b"ICY 200 OK\r\n",
        b"",
    ]
)
_FIELD = st.sampled_from(
    [
        b"Content-Length: 5\r\n",
        b"Content-Length: -1\r\n",
        b"Content-Length: 99999999999\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Content-Length: 3, 4\r\n",
        b"X: \xff\x00\r\n",
        b" folded\r\n",
        b"no colon\r\n",
    ]
)
_BODY = st.binary(max_size=64) | st.sampled_from([b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"ffffffff\r\nab", b"5;x\r\n"])
_ANSWERS = st.binary(max_size=200) | st.builds(
    lambda head, fields, end, body: head + b"".join(fields) + end + body,
    _HEAD,
    st.lists(_FIELD, max_size=4),
    st.sampled_from([b"\r\n", b"\n", b""]),
    _BODY,
)


@pytest.fixture(scope="module")
def peer() -> Iterator[Hostile]:
    with Hostile() as server:
        yield server


@given(_ANSWERS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_whatever_answers_a_request_it_is_an_answer_within_bounds_or_one_line(peer: Hostile, sent: bytes) -> None:
    peer.default = sent
    try:
        answer, said = ask(f"{peer.url}/health", timeout_s=2, max_bytes=8), ""
    except Unanswered as exc:
        answer, said = None, str(exc)
    if answer is None:
        assert said.startswith(f"engine at 127.0.0.1:{peer.port}: ")
        assert said.isascii()
        assert said.isprintable()
    else:
        assert 100 <= answer.status <= 999
        assert len(answer.body) <= 8
