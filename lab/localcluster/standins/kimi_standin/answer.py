"""The stand-in's "model": a deterministic answer to the last user message, and token counts.

A smoke test must pass against the real model and the stand-in alike, so the prompts such a test asks
get the answer a capable model gives; anything else gets a fixed transformation of the prompt:

1. an instruction to reply with something: ``Reply with exactly the word READY ...`` -> ``READY``;
   ``Say "hello world"`` -> ``hello world``; ``Repeat exactly: kimi is up`` -> ``kimi is up``;
2. integer arithmetic ``A op B`` (op one of ``+ - * x``): ``What is 17 * 23?`` -> ``391``;
3. otherwise ``kimi-standin: `` followed by the message reversed.
"""

from __future__ import annotations

import re
from typing import Any

FALLBACK_PREFIX = "kimi-standin: "

_DIRECTIVE = re.compile(
    r"\b(?:(?:reply|respond|answer)(?:\s+only)?\s+with|repeat(?:\s+after\s+me)?|say|echo|print|output|write)\b",
    re.IGNORECASE,
)
_QUOTED = re.compile(r"\"([^\"]+)\"|`([^`]+)`|\u201c([^\u201d]+)\u201d|'([^']+)'")
_NAMED = re.compile(r"\bthe\s+(?:single\s+)?(?:word|token|string|text|phrase|number)\s+(\S+)", re.IGNORECASE)
_AFTER_COLON = re.compile(r":\s*(\S.*?)\s*$", re.DOTALL)
_ARITHMETIC = re.compile(r"(-?\d+)\s*([-+*x\u00d7])\s*(-?\d+)")
_TRIM = ".,;:!?\"'`"


def text_of(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string, or a list of parts of which text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _directed(message: str) -> str | None:
    directive = _DIRECTIVE.search(message)
    if directive is None:
        return None
    rest = message[directive.end() :]
    quoted = _QUOTED.search(rest)
    if quoted is not None:
        return next(g for g in quoted.groups() if g is not None)
    named = _NAMED.search(rest)
    if named is not None:
        return named.group(1).strip(_TRIM) or None
    after = _AFTER_COLON.search(rest)
    if after is not None:
        return after.group(1).strip() or None
    return None


def _arithmetic(message: str) -> str | None:
    match = _ARITHMETIC.search(message)
    if match is None:
        return None
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    if op == "+":
        return str(a + b)
    if op == "-":
        return str(a - b)
    return str(a * b)


def answer(message: str) -> str:
    """The answer to ``message`` (see the module docstring); the same message always gets the same answer."""
    text = message.strip()
    return _directed(text) or _arithmetic(text) or FALLBACK_PREFIX + text[::-1]


def count_tokens(text: str) -> int:
    """Whitespace-separated words stand in for tokens: stable, and small enough to reason about in tests."""
    return len(text.split())
