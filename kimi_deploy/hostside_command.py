"""The shell command that runs one of ``hostside/`` with a host's Python, in one round-trip."""

from __future__ import annotations

import base64
import json
import shlex
import zlib
from pathlib import Path
from typing import Any

HOSTSIDE = Path(__file__).resolve().parent.parent / "hostside"

# Runs a shipped script with the host's python3 under __name__ == "__main__"; the script travels
# base64-encoded in argv (paths and digests only: never a secret).
_BOOT = (
    "import base64,sys;"
    "code=compile(base64.b64decode(sys.argv.pop(1)),sys.argv[0],'exec');"
    "exec(code,{'__name__':'__main__'})"
)


def pack(data: Any) -> str:
    """JSON, compressed and base64-encoded: one argv word, no quoting surprises."""
    return base64.b64encode(zlib.compress(json.dumps(data, sort_keys=True).encode(), 9)).decode()


def hostside_command(python: str, script: str, request: Any) -> str:
    """The shell command running ``hostside/<script>`` with ``python`` on the host."""
    code = base64.b64encode((HOSTSIDE / script).read_bytes()).decode()
    return " ".join([shlex.quote(python), "-c", shlex.quote(_BOOT), code, pack(request)])
