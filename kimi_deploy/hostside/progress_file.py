"""How far a long host program is, in bytes, for the controller to read while it runs.

The weights sync (``<dir>/.kimi/progress``, beside the revision's other state) and the release
install (``<release>.kimi-progress``, beside the release it builds) each keep one file while they
run: one line of three decimal integers, ``<bytes done> <bytes in all> <seconds since the epoch>``,
at most ``MAX_BYTES``. It is written whole beside its place and renamed into it (a reader never sees
half a line), root's and mode 0644 (any user the controller connects as reads it), and removed
when the program ends, whatever its result. Writing it never fails the program: progress is
for show. The controller reads it (``kimi_deploy.host.progress_reading``) and sums the hosts'.
"""

from __future__ import annotations

import contextlib
import os
import time

# Three integers of at most 19 digits and their separators.
MAX_BYTES = 64
# The release install's file: beside the release it builds (``<path>.kimi-new``).
RELEASE_SUFFIX = ".kimi-progress"
MODE = 0o644


def release_progress(path: str) -> str:
    """The progress file of the release install at ``path``."""
    return f"{path}{RELEASE_SUFFIX}"


def progress_line(done: int, total: int, when: float) -> str:
    """The file's one line: ``done`` clamped to ``0..total``."""
    total = max(0, int(total))
    return f"{min(max(0, int(done)), total)} {total} {int(when)}\n"


def write_progress(path: str, done: int, total: int) -> None:
    """Replace ``path`` with ``done`` of ``total`` bytes, now; nothing when it cannot be written."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(OSError):
        # O_NOFOLLOW: whatever stands at the temporary name, no link is followed as root.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, MODE)
        try:
            os.fchmod(fd, MODE)  # whatever the umask
            os.write(fd, progress_line(done, total, time.time()).encode("ascii"))
        finally:
            os.close(fd)
        os.replace(tmp, path)


def remove_progress(path: str) -> None:
    """The program ended: its progress file goes (and a temporary one a kill left)."""
    for name in (path, f"{path}.tmp"):
        with contextlib.suppress(OSError):
            os.remove(name)
