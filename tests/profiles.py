"""Whole host profiles for tests: the record ``parse_profile`` makes, with a test's parts in it."""

from __future__ import annotations

from typing import Any, cast

from kimi_deploy.host.profile import parse_profile
from kimi_deploy.host.profile_types import HostProfile


def profile_of(**parts: Any) -> HostProfile:
    """The all-unknown profile of an empty probe answer with ``parts`` laid over it: a section
    given as a dict adds to that section's keys (an accelerators' ``count`` and the rest unknown),
    anything else replaces it."""
    profile = parse_profile({})
    sections = cast(dict[str, Any], profile)
    for name, value in parts.items():
        assert name in sections, f"a HostProfile has no section {name}"
        here = sections[name]
        sections[name] = {**here, **value} if isinstance(here, dict) and isinstance(value, dict) else value
    return profile
