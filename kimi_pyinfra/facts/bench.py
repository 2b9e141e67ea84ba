"""The serving benchmark's record on its generator host (hostside/bench_load.py), read in one command."""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.hostside.bench_load import RESULT
from kimi_deploy.hostside.boundary_json import loads

# The record holds every request's answer (up to 4,000 characters each, six bytes a character once
# escaped) for every level of both targets: a benchmark of a few tasks at concurrency up to 64
# records hundreds of requests, some MB, and a recipe may ask for many more tasks and rounds. So
# its bound is wider than a probe's answer's (kimi_deploy/host/command.py).
RECORD_MAX_BYTES = 64 << 20


class BenchRecord(FactBase[dict[str, Any]]):
    """``/var/lib/kimi/bench.json``: ``{"run", "at", "targets": {"local": [level, ...], "hosted": [...]}}``,
    each level's requests (task row, answer text, tool calls, error, TTFT, latency, tokens), vLLM's
    summary, CPU times and peaks; empty when the host ran none."""

    def command(self) -> str:
        return f"cat {RESULT} 2>/dev/null || echo '{{}}'"

    def process(self, output: list[str]) -> dict[str, Any]:
        # A host's file: outside the recipe, read through the boundary's bounds.
        found = loads("\n".join(output), "benchmark record", max_bytes=RECORD_MAX_BYTES)
        return found if isinstance(found, dict) else {}
