"""A benchmark answer judged by its task's acceptance rule: success is counted, not assumed.

The answer comes from a host (the generator's record of what the endpoint sent), so it is outside
the recipe: it is read as data only, bounded by ``hostside.boundary_json`` where it was loaded, and
never run or formatted into anything but a reason line (``shown``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from jsonschema import Draft202012Validator

from hostside.boundary_text import shown
from kimi_deploy.recipe import BenchTask


def judge(task: BenchTask, text: str, tool_calls: list[Any] | None = None) -> str | None:
    """None when the answer passes ``task``'s rule, else why it does not (one short phrase)."""
    rule = task.expect
    if rule.exact is not None:
        got = text.strip()
        return None if got == rule.exact else f"expected exactly {shown(rule.exact)}, found {shown(got[:80])}"
    if rule.regex is not None:
        return None if re.search(rule.regex, text) else f"no match for /{rule.regex}/ in {shown(text.strip()[:80])}"
    if rule.json_schema is not None:
        try:
            value = json.loads(text.strip())
        except ValueError:
            return f"not one JSON value: {shown(text.strip()[:80])}"
        error = next(iter(Draft202012Validator(rule.json_schema).iter_errors(value)), None)
        return None if error is None else f"JSON schema: {error.message[:160]}"
    assert rule.tool_call is not None
    return _tool_call(rule.tool_call.name, rule.tool_call.arguments, tool_calls or [])


def _tool_call(name: str, arguments: dict[str, Any], calls: list[Any]) -> str | None:
    """None when one of ``calls`` (OpenAI ``tool_calls``) calls ``name`` with ``arguments``."""
    seen: list[str] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        seen.append(str(function.get("name")))
        if function.get("name") != name:
            continue
        raw = function.get("arguments")
        try:
            given = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return f"{name} called with arguments that are not JSON: {shown(str(raw)[:80])}"
        if not isinstance(given, dict):
            given = {}
        wrong = {k: given.get(k) for k, v in arguments.items() if given.get(k) != v}
        if not wrong:
            return None
        return f"{name} called with {shown(wrong)}, expected {shown({k: arguments[k] for k in wrong})}"
    if not seen:
        return f"no tool call (expected {name})"
    return f"called {shown(seen)}, expected {name}"
