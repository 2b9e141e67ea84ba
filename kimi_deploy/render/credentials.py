"""Secret files an engine opens itself, handed to it by systemd as credentials.

Every secret file under ``<config>/secrets`` is root's alone (0600). systemd, as PID 1, reads it at
each start: an ``EnvironmentFile=`` for variables, or ``LoadCredential=<name>:<path>`` for a file
the engine opens itself (SGLang's ``--config``). The engine then finds a copy in its credentials
directory (``%d`` in a unit file), on a read-only file system only the unit's user reads; what the
next start reads stays out of its reach.
"""

from __future__ import annotations

import re


class CredentialPath(str):
    """An ExecStart word naming a file in the unit's credentials directory, ``%d/<name>``.

    Only code makes one (``credential``), so a unit file keeps its ``%d`` while every other word,
    whatever a recipe holds, has its ``%`` escaped.
    """


def credential(name: str) -> CredentialPath:
    """The path the engine reads credential ``name`` at: the unit file loads each of the unit's
    ``secret_files`` as a credential named after the file (``engine.service.j2``)."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name):
        raise ValueError(f"credential name {name!r}: letters, digits, '-', '_' and '.' only")
    return CredentialPath(f"%d/{name}")
