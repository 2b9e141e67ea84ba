"""What a host holds of the files a converge would write that differ from the converge's: the
state probe's ``contents``, asked only by a run that shows its diff (pyinfra's ``--diff``).

The controller asks with the digest of each file it would write (never a secret's path: a secret
is never sent back); the host answers only for those whose digest differs: null for a file it
does not hold, else its size and its text, where it is UTF-8 text within the bounds (a file of
``FILE_MOST`` bytes at most, ``TOTAL_MOST`` of encoded answer over all files); beyond them, or
for a file that is not text, ``why`` it is not shown. Stdlib only: it runs within the probe.
"""

from __future__ import annotations

import json
import os
import stat

from kimi_deploy.hostside.shared_queries import file_sha256

TYPE_CHECKING = False  # typing costs every probe several ms to import: for type checkers only
if TYPE_CHECKING:
    from kimi_deploy.hostside.probe_types import CurrentFile

# The most of one file's content the answer holds, and of all of them (as JSON encodes them:
# within ``kimi_deploy.host.command.ANSWER_MAX_BYTES`` with the rest of the probe's answer).
FILE_MOST = 64 << 10
TOTAL_MOST = 1 << 20


def changed_files(
    wanted: dict[str, str], file_most: int = FILE_MOST, total_most: int = TOTAL_MOST
) -> dict[str, CurrentFile | None]:
    """Each path of ``wanted`` (path -> the sha256 of the content the converge writes) whose file
    differs from it: None when absent, else what the host holds of it (``CurrentFile``)."""
    out: dict[str, CurrentFile | None] = {}
    left = total_most
    for path in sorted(wanted):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out[path] = None
            continue
        except OSError:
            out[path] = {"size": 0, "text": None, "why": "unreadable"}
            continue
        if not stat.S_ISREG(st.st_mode):  # a folder, a FIFO (whose read would wait): never read
            out[path] = {"size": st.st_size, "text": None, "why": "not a file"}
            continue
        if file_sha256(path) == wanted[path]:
            continue
        if st.st_size > file_most:
            out[path] = {"size": st.st_size, "text": None, "why": "large"}
            continue
        try:
            with open(path, "rb") as f:
                data = f.read(file_most + 1)
        except OSError:
            out[path] = {"size": st.st_size, "text": None, "why": "unreadable"}
            continue
        if len(data) > file_most:  # it grew since
            out[path] = {"size": len(data), "text": None, "why": "large"}
            continue
        try:
            text: str | None = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or "\x00" in text:
            out[path] = {"size": len(data), "text": None, "why": "binary"}
            continue
        encoded = len(json.dumps(text))
        if encoded > left:
            out[path] = {"size": len(data), "text": None, "why": "total"}
            continue
        left -= encoded
        out[path] = {"size": len(data), "text": text, "why": ""}
    return out
