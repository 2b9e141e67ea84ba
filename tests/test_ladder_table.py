"""The context ladder's proofs as deploys/ladder.py prints them: every rung of every host, a
failure's reason, and an upgrade's time to first token against the release it replaced."""

from __future__ import annotations

from typing import Any

from kimi_deploy.serving.ladder_table import format_proofs


def _proof(rung: int, key: str, ttft: float | None, passed: bool = True, reason: str | None = None) -> dict[str, Any]:
    return {
        "unit": "kimi-vllm",
        "rung": rung,
        "key": key,
        "passed": passed,
        "reason": reason,
        "ttft_s": ttft,
        "prompt_tokens": rung // 5,
        "decode_tok_s": 40.0,
        "kv_cache_usage": 0.129,
        "at": "2026-12-03T21:30:00Z",
    }


def test_each_rung_is_a_row_and_an_upgrade_is_compared_with_the_release_it_replaced() -> None:
    proofs = {
        "kimi-h1": [
            _proof(32768, "old", 2.0),
            _proof(131072, "old", 30.0),
            _proof(32768, "new", 1.5),
            _proof(131072, "new", 33.0),
            _proof(262144, "new", None, passed=False, reason="KV cache is needed"),
        ],
        "kimi-h2": [],
    }
    lines = format_proofs(proofs).splitlines()
    assert lines[0].split()[:4] == ["host", "unit", "rung", "result"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[2], r[3]) for r in rows] == [
        ("32768", "passed"),
        ("131072", "passed"),
        ("32768", "passed"),
        ("131072", "passed"),
        ("262144", "failed:"),
    ]
    # The same rung under the key before: -25% at 32768 (2.00 s then), +10% at 131072.
    assert "-25% (2.00)" in lines[3]
    assert "+10% (30.00)" in lines[4]
    assert "'KV cache is needed'" in lines[5]
    # The first climb has nothing to compare with.
    assert "%" not in lines[1].replace("13%", "")


def test_no_climb_anywhere_is_one_line() -> None:
    assert format_proofs({"kimi-h1": [], "kimi-h2": []}) == "no host of 2 climbed the context ladder"
