"""Reading rendered systemd unit files back the way systemd does, for tests."""

from __future__ import annotations

import re


def _words(value: str) -> list[str]:
    """Split an ExecStart= value into words with systemd's quoting rules (no specifiers left)."""
    words: list[str] = []
    i = 0
    n = len(value)
    while i < n:
        while i < n and value[i] in " \t":
            i += 1
        if i >= n:
            break
        word = ""
        if value[i] in "'\"":
            quote = value[i]
            i += 1
            while value[i] != quote:
                if value[i] == "\\":
                    i += 1
                word += value[i]
                i += 1
            i += 1
        else:
            while i < n and value[i] not in " \t":
                word += value[i]
                i += 1
        words.append(word.replace("%%", "%").replace("$$", "$"))
    return words


def logical_lines(text: str) -> list[str]:
    """A unit file's settings as systemd reads its lines: comments, sections and blank lines
    skipped, a line ending in a backslash going on with the next one."""
    out: list[str] = []
    pending = ""
    for raw in re.split("\r\n|\n|\r", text):
        if not pending and (not raw.strip() or raw.startswith(("#", ";", "["))):
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        out.append(pending + raw)
        pending = ""
    return out


def directives(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, continued lines joined, values in file order."""
    out: dict[str, list[str]] = {}
    for line in logical_lines(text):
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def exec_argv(text: str) -> list[str]:
    """The argv systemd would run for the unit's single ExecStart=."""
    (value,) = directives(text)["ExecStart"]
    return _words(value)
