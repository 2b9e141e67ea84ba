"""The context ladder's proofs a host recorded (hostside/ladder.py), read in one command."""

from __future__ import annotations

from typing import Any

from pyinfra.api.facts import FactBase

from kimi_deploy.host.command import ANSWER_MAX_BYTES
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.host_dirs import STATE_DIR

PROOFS = f"{STATE_DIR}/ladder.json"


class LadderProofs(FactBase[list[dict[str, Any]]]):
    """Every rung the host's engines climbed, oldest first, as ``/var/lib/kimi/ladder.json``
    holds them: ``{"rung", "passed", "reason", "ttft_s", "decode_tok_s", "prompt_tokens",
    "kv_cache_usage", "accelerator_memory_mib", "unit_memory_mib", "unit", "topology", "engine",
    "hardware", "key", "at", "run"}``; empty when it climbed none."""

    def command(self) -> str:
        return f"cat {PROOFS} 2>/dev/null || echo '{{}}'"

    def process(self, output: list[str]) -> list[dict[str, Any]]:
        # A host's file: outside the recipe, read through the boundary's bounds.
        found = loads("\n".join(output), "ladder proofs", max_bytes=ANSWER_MAX_BYTES)
        proofs = found.get("proofs") if isinstance(found, dict) else None
        return [p for p in proofs if isinstance(p, dict)] if isinstance(proofs, list) else []
