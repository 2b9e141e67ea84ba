"""File names inside a model revision: the one rule for every name that comes from the Hub's listing.

A name reaches a host as a key of the lock (``kimi-deploy lock`` copies the Hub's tree listing,
``read_lock`` reads it back, the host programs receive it), and the host programs open, write, link
and unlink ``<revision folder>/<name>`` as root. So a name is a relative POSIX path that stays
inside the revision: ``check_name`` is the rule, ``inside`` the path a host program may touch.
Stdlib only: the controller and the host programs (bundled with it) run this same code.
"""

from __future__ import annotations

import os
import re

from kimi_deploy.hostside.boundary_text import CONTROL, shown

MAX_NAME_CHARS = 1024
MAX_SEGMENT_BYTES = 255  # NAME_MAX of Linux filesystems
# The revision folder's own state (verification cache, partial downloads, huggingface_hub's
# metadata): never a model file, so a listing cannot overwrite it.
RESERVED = (".kimi", ".cache")
# Control characters, and lone surrogates (no file system name can hold one).
_REFUSED = re.compile(f"{CONTROL.pattern}|[\ud800-\udfff]")


class BadName(ValueError):
    """A name (or the path it resolves to) refused; ``str()`` is one line naming the name and the rule."""

    def __init__(self, name: object, rule: str) -> None:
        self.shown = shown(name)
        self.rule = rule
        super().__init__(f"model file name {self.shown}: {rule}")


def check_name(name: object) -> str:
    """``name`` when it is a relative POSIX path inside a revision, else ``BadName``.

    Refused: a non-string, empty or over-long name; a leading ``/``; a backslash; a control
    character (C0, DEL, C1, NUL included) or a lone surrogate; an empty, ``.`` or ``..`` segment;
    a segment over 255 bytes; a first segment naming the revision's own ``.kimi``/``.cache`` folder.
    """
    if not isinstance(name, str):
        raise BadName(name, "must be a string")
    if not name:
        raise BadName(name, "must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise BadName(name, f"must be at most {MAX_NAME_CHARS} characters")
    bad = _REFUSED.search(name)
    if bad is not None:
        raise BadName(name, f"must not hold control character or surrogate U+{ord(bad.group()):04X}")
    if "\\" in name:
        raise BadName(name, "must not hold a backslash")
    if name.startswith("/"):
        raise BadName(name, "must be relative (no leading '/')")
    segments = name.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise BadName(name, f"must not have an empty, '.' or '..' segment, found {segment!r}")
        if len(segment.encode()) > MAX_SEGMENT_BYTES:
            raise BadName(name, f"must not have a segment over {MAX_SEGMENT_BYTES} bytes")
    if segments[0] in RESERVED:
        raise BadName(name, f"must not be under {segments[0]}/ (the revision folder's own state)")
    return name


def check_names(names: object) -> list[str]:
    """Every name of a lock's ``{name: ...}`` mapping, checked; ``BadName`` at the first refused."""
    if not isinstance(names, dict):
        raise BadName(names, "a lock's files must be a mapping of names")
    return [check_name(name) for name in names]


def inside(root: str, name: str) -> str:
    """``root/name`` for a checked ``name`` whose resolved path (symlinks followed) stays under the
    resolved ``root``; ``BadName`` otherwise. The path returned is unresolved: replacing or removing
    it acts on the name itself, never on what a symlink there points at."""
    check_name(name)
    base = os.path.realpath(root)
    path = os.path.join(base, name)
    real = os.path.realpath(path)
    if os.path.commonpath([base, real]) != base or real == base:
        raise BadName(name, f"resolves to {shown(real)}, outside {shown(base)} (a symlink on the way)")
    return path
