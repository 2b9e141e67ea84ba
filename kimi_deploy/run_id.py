"""The id of one pyinfra run, the same on every host: when it started (UTC) and a random part.

Release log entries carry it, so a rollback knows which hosts the latest converge switched; the
communication check uses it to trust only listeners of its own run. Ids sort by start time.
"""

from __future__ import annotations

import secrets
import time

_ID: list[str] = []


def run_id() -> str:
    if not _ID:
        _ID.append(time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4))
    return _ID[0]
