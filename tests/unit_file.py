"""Reading rendered systemd unit files back the way systemd does, for tests."""

from __future__ import annotations


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


def directives(text: str) -> dict[str, list[str]]:
    """Every ``Key=value`` of a unit file, continued lines joined, values in file order."""
    out: dict[str, list[str]] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if not pending and (raw.startswith("#") or raw.startswith("[") or not raw.strip()):
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        logical.append(pending + raw)
        pending = ""
    for line in logical:
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def exec_argv(text: str) -> list[str]:
    """The argv systemd would run for the unit's single ExecStart=."""
    (value,) = directives(text)["ExecStart"]
    return _words(value)
