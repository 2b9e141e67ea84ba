"""A file written whole or not at all: a temporary file beside it, renamed over it."""

from __future__ import annotations

import os
import tempfile


def write_whole(path: str, content: str, mode: int) -> None:
    """``content`` at ``path`` with ``mode``; a reader sees the old file or the new one, never part."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".kimi-write-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
