"""What a peer or a host may send ``hostside.boundary_json.loads``: texts built to make its depth
measure slow or wrong. Each is answered with the right verdict (the value, or one refusal line that
starts with ``where``) in time linear in its size: the controller decodes probe answers and peer
lines on its one event loop, so a text that took seconds per 100 KB would stall every host's deploy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from kimi_deploy.hostside.boundary_json import depth, loads
from kimi_pyinfra.facts.host_state import KimiHostState
from tests.conftest import ROOT

# starts a process or a server: not the unit tier (tests/tier.py)
pytestmark = pytest.mark.processes

N = 1 << 20  # 1 MiB: the former depth measure took minutes on each of these


def _in_time(expression: str, expected: str, seconds: float = 20) -> None:
    """Evaluate ``expression`` (a 1 MiB text through ``loads``) in a process of its own, with a
    deadline generous for a linear decoder: the verdict it prints must be ``expected``."""
    program = textwrap.dedent(f"""
        from kimi_deploy.hostside.boundary_json import loads
        N = {N}
        try:
            value = loads({expression}, "kimi-h2's answer", max_bytes=4 * N)
            print("value", type(value).__name__)
        except ValueError as exc:
            print("refused", exc)
    """)
    run = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=seconds, check=False
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert run.stdout.strip() == expected


# (text's expression, its verdict): each with more than 32 brackets, so that the depth is measured
HOSTILE = {
    # an unterminated string of escaped quotes after the brackets
    "escaped-quotes": (
        """'[' * 40 + '"' + '\\\\"' * (N // 2)""",
        "refused kimi-h2's answer: JSON nested deeper than 32 levels",
    ),
    # the same inside a closed document: every quote is escaped, the brackets are text
    "escaped-quotes-closed": ("""'["' + '\\\\"' * (N // 2) + '[' * 40 + '"]'""", "value list"),
    "backslashes": (
        """'[' * 40 + '"' + '\\\\\\\\' * (N // 2)""",
        "refused kimi-h2's answer: JSON nested deeper than 32 levels",
    ),
    "backslashes-closed": ("""'["' + '\\\\\\\\' * (N // 2) + '", ' + '[1], ' * 40 + '0]'""", "value list"),
    "quotes": ("""'[' * 40 + '"' * N""", "refused kimi-h2's answer: JSON nested deeper than 32 levels"),
    "brackets-inside-a-string": ("""'["' + '[' * N + '"]'""", "value list"),
    "brackets-outside": ("""'[' * N""", "refused kimi-h2's answer: JSON nested deeper than 32 levels"),
    # an escaped backslash ends before the quote: the brackets after it are outside the string
    "escaped-backslash-then-brackets": (
        """'["\\\\\\\\", ' + '[' * N""",
        "refused kimi-h2's answer: JSON nested deeper than 32 levels",
    ),
}


@pytest.mark.parametrize(("expression", "expected"), list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_mebibyte_gets_its_verdict_in_time(expression: str, expected: str) -> None:
    _in_time(expression, expected)


def test_escapes_decide_where_a_string_ends() -> None:
    # \\" : a backslash, then the string's end; \" : a quote inside it
    assert depth(b'["\\\\", [[1]]]') == 3
    assert depth(b'["\\", [[1]]"]') == 1
    assert depth(b'["\\\\\\", [[1]]"]') == 1
    assert loads('["\\\\", [[1]]]', "peer") == ["\\", [[1]]]
    deep = '["\\\\", ' + "[" * 40 + "]" * 40 + "]"
    with pytest.raises(ValueError, match=r"^peer: JSON nested deeper than 32 levels$"):
        loads(deep, "peer")
    hidden = '["\\", ' + "[" * 40 + '"]'
    assert loads(hidden, "peer") == ['", ' + "[" * 40]


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le"])
def test_brackets_hidden_from_a_byte_scan_in_utf_16_are_counted(encoding: str) -> None:
    """In UTF-16, U+2200 holds a 0x22 byte: a scan of the bytes would see a string where the
    decoder sees brackets, and the decoder would recurse through them."""
    text = '["\u2200",' + "[" * 100_000 + '"\u2200"'
    with pytest.raises(ValueError, match=r"^peer: JSON nested deeper than 32 levels$"):
        loads(text.encode(encoding), "peer", max_bytes=1 << 22)


def test_a_long_benign_answer_reads_back() -> None:
    answer: dict[str, Any] = {
        "files": {f"/opt/kimi/releases/{i:04d}/model-{i:05d}.safetensors": "ab" * 32 for i in range(5000)},
        "quoted": ['say "hi" \\ [not nesting] {nor this}'] * 1000,
        "nested": [[[[{"a": [1, 2, {"b": "]]]}"}]}]]]] * 100,
    }
    raw = json.dumps(answer).encode()
    assert loads(raw, "state probe", max_bytes=len(raw)) == answer
    assert depth(raw) == _nesting(answer)


def _nesting(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_nesting, value), default=0)
    return 0


def test_a_host_probe_answer_past_what_a_probe_sends_is_refused_in_one_line() -> None:
    """A real state answer is some 1.2 MB at most (kimi_deploy/host/command.py); a host that
    sends 9 MiB of escaped quotes is refused before its text is scanned."""
    files = {f"/opt/kimi/models/m/model-{i:05d}.safetensors": "ab" * 32 for i in range(12_000)}
    real = json.dumps({"user": True, "files": files})
    assert 1_000_000 < len(real) < 2_000_000
    assert KimiHostState().process([f"state {real}"])["files"] == files
    hostile = '{"user": "' + '\\"' * (9 << 19) + '"}'
    with pytest.raises(ValueError, match=r"^state probe: \d+ bytes of JSON, over the limit of 8388608$"):
        KimiHostState().process([f"state {hostile}"])
