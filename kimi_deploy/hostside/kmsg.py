"""The kernel's log, read as ``/dev/kmsg`` gives it: one record per line,
``<prio>,<seq>,<usec>,<flags>[,...];<message>``, its continuation lines (``KEY=value``) starting
with a space (the kernel's Documentation/ABI/testing/dev-kmsg). Opened once and read on: each
``read()`` returns the records logged since the last one; the first returns what the ring buffer
still holds of this boot. ``usec`` is the kernel's clock since boot, CLOCK_MONOTONIC's own base,
which systemd's ``*TimestampMonotonic`` share: a record can be placed before or after a unit
started. A reader behind by more than the buffer holds is told so (EPIPE) and goes on with the
oldest record left.

Reading needs CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1 (Debian's and Ubuntu's default).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

# The kernel's own facility (LOG_KERN): a driver's messages. Root may write other records into
# /dev/kmsg (facility LOG_USER, 1, by default); those are not the kernel's word.
KERNEL = 0
CHUNK = 65536


@dataclass(frozen=True)
class Record:
    facility: int
    level: int
    seq: int
    usec: int
    message: str


def parse(line: bytes) -> Record | None:
    """One record line, or None for a continuation line or one not in the format."""
    if not line or line.startswith(b" "):
        return None
    head, sep, message = line.partition(b";")
    fields = head.split(b",")
    if not sep or len(fields) < 4 or not all(f.isdigit() for f in fields[:3]):
        return None
    prio = int(fields[0])
    # the kernel escapes unprintable bytes (a newline inside a message is \x0a)
    text = message.decode("utf-8", "replace").replace("\\x0a", " ")
    return Record(prio >> 3, prio & 7, int(fields[1]), int(fields[2]), text)


class Kmsg:
    """``path`` (``/dev/kmsg``), opened on the first ``read`` and kept open; ``error`` says why
    it could not be read, or None."""

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path
        self.fd: int | None = None
        self.error: str | None = None
        self._partial = b""

    def read(self) -> list[Record]:
        """The records logged since the last read."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self.error = f"{self.path}: {exc.strerror or exc}"
                return []
            self.error = None
        data = bytearray(self._partial)
        while True:
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten before they were read: on with the oldest left
                self.error = f"{self.path}: {exc.strerror or exc}"
                break
            if not chunk:
                break
            data += chunk
        lines = bytes(data).split(b"\n")
        # a record is whole per read on the device; a plain file may end mid-line
        self._partial = lines.pop()
        return [r for line in lines if (r := parse(line)) is not None]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
