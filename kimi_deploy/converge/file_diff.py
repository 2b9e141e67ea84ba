"""The diff of every file a converge would change on a host, as a run with pyinfra's ``--diff``
shows it before it changes anything (``deploys/kimi.py``).

What the host holds comes from the converge's own probe (``hostside/changed_files.py``: asked
with the digest of each file the converge writes, it sends back those that differ, bounded in
size, text only); what the converge writes, from ``kimi_deploy.converge.host_files``. A secret is
never asked for: its digest alone says whether it changes. The host's text is the host's: read
as the boundary reads any, sizes checked again, each line shown through ``printable`` (an escape
sequence on the host shows as text and does nothing to the terminal).

Pure: from the files and the probe's answer.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.hostside.changed_files import FILE_MOST, TOTAL_MOST
from kimi_deploy.render.files import RenderedFile

# Why the host did not send a file's text, as a line says it.
_NOT_SHOWN = {
    "binary": "binary, not shown",
    "large": "{size} bytes, not shown",
    "total": f"{{size}} bytes, not shown (one host's diff shows {TOTAL_MOST >> 20} MiB of its text at most)",
    "not a file": "not a regular file, not shown",
    "unreadable": "unreadable, not shown",
}
NO_NEWLINE = "\\ No newline at end of file"


def diff_request(files: Sequence[RenderedFile]) -> dict[str, str]:
    """The probe's ``diff``: the sha256 of each of ``files`` by path, secrets and contents the
    plan does not know (``withheld``) left out: the host never sends them back."""
    return {f.path: f.sha256 for f in files if not f.secret and not f.withheld}


def file_diffs(host: str, files: Sequence[RenderedFile], found: HostState, readers: str, release_dir: str) -> list[str]:
    """The lines that show what the converge would change of ``files`` on ``host`` (``found``: its
    probe's answer, asked with ``diff_request(files)``; ``readers``: the engine user's group), in
    their order: a unified diff of each text file whose content changes (``--- HOST:PATH (on the
    host)``, ``+++ HOST:PATH (the recipe)``), one line for a secret that changes, for a file whose
    text the host did not send and for an owner or mode put back, and one line for the files of
    the release folder (``release_dir``) absent on the host: its record and copies. Empty when none
    changes."""
    drivers: Mapping[str, Any] = found.get("drivers") or {}
    digests = {**(drivers.get("files") or {}), **found["files"]}
    owners = {**(drivers.get("owners") or {}), **found["owners"]}
    contents: Mapping[str, Any] = found.get("contents") or {}
    where = printable(host)
    out: list[str] = []
    new_release = 0
    left = TOTAL_MOST
    for f in files:
        name = f"{where}:{printable(f.path)}"
        if f.secret or f.withheld:
            out += _secret(name, f, digests)
        elif f.path in contents:
            entry = contents[f.path]
            if entry is None and f.path.startswith(release_dir + "/"):
                new_release += 1
                continue
            text, why = _current(entry)
            if text is None and why is None:
                out += _diff(name, [], f.content, absent=True)
            elif text is None:
                out.append(f"{name}: changes (on the host: {why})")
            elif (size := len(text.encode("utf-8"))) > left:
                out.append(f"{name}: changes (on the host: {_NOT_SHOWN['total'].format(size=size)})")
            else:
                left -= size
                out += _diff(name, _lines(text), f.content)
        owner = owners.get(f.path)
        if isinstance(owner, str) and owner != f.owner_mode(readers):
            out.append(f"{name}: owner and mode {printable(owner)} on the host, {f.owner_mode(readers)} in the recipe")
    if new_release:
        out.append(
            f"{where}:{printable(release_dir)}/: the release folder: {new_release} files written (its record"
            " and the copy of each file a rollback puts back)"
        )
    return out


def _secret(name: str, f: RenderedFile, digests: Mapping[str, str | None]) -> list[str]:
    """A secret's one line, by its digest alone: its content is never shown nor asked for."""
    if f.path not in digests:  # not probed: the run's own content (the weights transfer key)
        return [f"{name}: secret written (its content is the run's)"]
    found = digests[f.path]
    if found is None:
        return [f"{name}: secret written (absent on the host)"]
    return [f"{name}: secret changed"] if found != f.sha256 else []


def _current(entry: Any) -> tuple[str | None, str | None]:
    """The host's text of a file that differs, or why none is shown; ``(None, None)``: absent.
    Whatever the host sent that is not text within the bounds is not shown."""
    if entry is None:
        return None, None
    if not isinstance(entry, dict):
        return None, "an answer that is not one, not shown"
    text, size, why = entry.get("text"), entry.get("size"), entry.get("why")
    if isinstance(text, str):
        return _text(text)
    said = _NOT_SHOWN.get(why) if isinstance(why, str) else None
    size = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else "?"
    return None, said.format(size=size) if said else "not shown"


def _text(text: str) -> tuple[str | None, str | None]:
    """``text`` from the host, if it is text within one file's bound; else why it is not shown."""
    try:
        data = text.encode("utf-8")  # strict: a lone surrogate is no text a file holds
    except UnicodeEncodeError:
        return None, "not UTF-8 text, not shown"
    if len(data) > FILE_MOST:
        return None, _NOT_SHOWN["large"].format(size=len(data))
    if "\x00" in text:
        return None, _NOT_SHOWN["binary"]
    return text, None


def _lines(text: str) -> list[str]:
    """``text``'s lines, each with its newline but a last one without: split at newlines alone
    (a control character the host's text holds is shown, not taken for a line break)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _diff(name: str, current: list[str], wanted: str, *, absent: bool = False) -> list[str]:
    """The unified diff of ``current`` (the host's lines) to ``wanted`` (the recipe's text), each
    line shown through ``printable``."""
    before = f"{name} (absent on the host)" if absent else f"{name} (on the host)"
    lines = difflib.unified_diff(current, _lines(wanted), before, f"{name} (the recipe)", lineterm="")
    out: list[str] = []
    for i, line in enumerate(lines):
        if i < 2 or line.startswith("@@"):  # the headers: the names are printable already
            out.append(line)
            continue
        out.append(printable(line.removesuffix("\n")))
        if not line.endswith("\n"):
            out.append(NO_NEWLINE)
    return out
