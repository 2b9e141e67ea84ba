"""A benchmark answer judged by its task's acceptance rule: success is counted, not assumed.

The answer comes from a host (the generator's record of what the endpoint sent), so it is outside
the recipe: it is read as data only, bounded by ``hostside.boundary_json`` where it was loaded, and
never run or formatted into anything but a reason line (``shown``). The JSON inside it (an answer
a JSON Schema rule reads, a tool call's arguments) is decoded through the same bounds: an answer
past them fails its task with the bound as its reason, never an exception that would lose the
benchmark's report.
"""

from __future__ import annotations

import re
from typing import Any

from jsonschema import Draft202012Validator

from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.recipe import BenchTask

# The JSON an answer may hold: far more than a task's schema or tool asks for (the generator keeps
# 4,000 characters of a text), far less than Python's recursion, which the decoder and the schema's
# validation both use.
ANSWER_MAX_BYTES = 1 << 20
ANSWER_MAX_DEPTH = 64
_WHERE = "answer"


def _decoded(text: str) -> tuple[Any, str | None]:
    """The JSON value ``text`` holds, or None and why not: ``"not JSON"`` or the bound it is past."""
    try:
        return loads(text, _WHERE, max_bytes=ANSWER_MAX_BYTES, max_depth=ANSWER_MAX_DEPTH), None
    except ValueError as exc:
        rule = str(exc).removeprefix(f"{_WHERE}: ")
        return None, "not JSON" if rule.startswith("not JSON") else rule


def judge(task: BenchTask, text: str, tool_calls: list[Any] | None = None) -> str | None:
    """None when the answer passes ``task``'s rule, else why it does not (one short phrase)."""
    rule = task.expect
    if rule.exact is not None:
        got = text.strip()
        return None if got == rule.exact else f"expected exactly {shown(rule.exact)}, found {shown(got[:80])}"
    if rule.regex is not None:
        return None if re.search(rule.regex, text) else f"no match for /{rule.regex}/ in {shown(text.strip()[:80])}"
    if rule.json_schema is not None:
        value, fault = _decoded(text.strip())
        if fault == "not JSON":
            return f"not one JSON value: {shown(text.strip()[:80])}"
        if fault is not None:
            return f"not one JSON value within bounds: {fault}"
        error = next(iter(Draft202012Validator(rule.json_schema).iter_errors(value)), None)
        return None if error is None else f"JSON schema: {error.message[:160]}"
    assert rule.tool_call is not None
    return _tool_call(rule.tool_call.name, rule.tool_call.arguments, tool_calls or [])


# ``arguments``: the recipe's expected JSON arguments (``ToolCallExpect.arguments``), any shape
def _tool_call(name: str, arguments: dict[str, Any], calls: list[Any]) -> str | None:
    """None when one of ``calls`` (OpenAI ``tool_calls``) calls ``name`` with ``arguments`` (JSON
    values, as the recipe types them: ``ToolCallExpect.arguments``)."""
    seen: list[str] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        seen.append(str(function.get("name")))
        if function.get("name") != name:
            continue
        raw = function.get("arguments")
        given, fault = _decoded(raw) if isinstance(raw, str) else (raw, None)
        if fault == "not JSON":
            return f"{name} called with arguments that are not JSON: {shown(str(raw)[:80])}"
        if fault is not None:
            return f"{name} called with arguments past bounds: {fault}"
        if not isinstance(given, dict):
            given = {}
        wrong = {k: given.get(k) for k, v in arguments.items() if given.get(k) != v}
        if not wrong:
            return None
        return f"{name} called with {shown(wrong)}, expected {shown({k: arguments[k] for k in wrong})}"
    if not seen:
        return f"no tool call (expected {name})"
    return f"called {shown(seen)}, expected {name}"
