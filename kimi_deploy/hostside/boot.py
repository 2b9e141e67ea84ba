"""The first lines a host runs of a shipped program (``kimi_deploy.host.command``): ``python3 -c``
with this source, then the program's name, its digest, the program (zlib, base64; ``-`` where the
controller expects the host to keep it compiled) and its request.

Compiling a program costs a host more than running a converged host's probe does in places
(the probe's bundle is 58 KB of source: about 7 ms of CPU on every run, on every host). The code
objects are kept in ``CACHE`` (one file per program and Python, named by the program's digest,
which the controller computed over the source it sent), so a host compiles each version once.

The folder is trusted only as this user made it: a real directory, owned by the effective user,
writable by no one else; a kept file is read only when it is a regular file (no link) of the same
owner and mode, and only as a dict of code objects. Anything else, or any error, and the program
is compiled from argv as if nothing were kept: the cache can make a run faster, never different.
A program run from a file (the scrub) never comes here and compiles as before.
"""

from __future__ import annotations

import binascii
import marshal
import os
import stat
import sys
import zlib
from types import CodeType

CACHE = "/var/cache/kimi-deploy"
# Printed alone when the controller sent the program's digest without the program (``-``) and
# no compiled copy of that digest is kept here (kimi_deploy.host.command ``NOT_KEPT``).
NOT_KEPT = "kimi-boot: not kept"


def _trusted(st: os.stat_result, kind: int) -> bool:
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _folder() -> str | None:
    try:
        os.makedirs(CACHE, mode=0o700, exist_ok=True)
        return CACHE if _trusted(os.lstat(CACHE), stat.S_IFDIR) else None
    except OSError:
        return None


def _load(path: str) -> dict[str, CodeType]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        try:
            # only what this user wrote, in a folder no one else writes (_folder)
            codes = marshal.load(f) if _trusted(os.fstat(fd), stat.S_IFREG) else None  # noqa: S302
        except (EOFError, ValueError, TypeError, OSError):
            return {}
    if isinstance(codes, dict) and all(isinstance(k, str) and type(c) is CodeType for k, c in codes.items()):
        return codes
    return {}


def _keep(folder: str, script: str, digest: str, tag: str, codes: dict[str, CodeType]) -> None:
    """Writes ``codes`` as ``folder/<script>-<digest>-<tag>`` (whole or not at all) and removes
    the program's other versions: the folder holds one file per program and Python."""
    name = f"{script}-{digest}-{tag}"
    temporary = os.path.join(folder, f".{name}.{os.getpid()}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps(codes))
        os.replace(temporary, os.path.join(folder, name))
        for other in os.listdir(folder):
            if other.startswith(f"{script}-") and other.endswith(f"-{tag}") and other != name:
                os.unlink(os.path.join(folder, other))
    except (OSError, ValueError):
        try:  # noqa: SIM105 - contextlib would cost every boot an import
            os.unlink(temporary)
        except OSError:
            pass


def main() -> None:
    script, digest, packed = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1)
    folder = _folder()
    # the Python's own tag and version: marshal's format is one Python's
    tag = f"{sys.implementation.cache_tag}.{sys.hexversion:x}"
    codes = _load(os.path.join(folder, f"{script}-{digest}-{tag}")) if folder else {}
    found = len(codes)

    def compiled(source: str, filename: str) -> CodeType:
        """The bundle's loader compiles its modules through this (hostside_command._LOADER)."""
        code = codes.get(filename)
        if code is None:
            code = codes[filename] = compile(source, filename, "exec")
        return code

    def keep() -> None:
        """The loader calls this once everything is compiled, before the program runs."""
        if folder and len(codes) != found:
            _keep(folder, script, digest, tag, codes)

    outer = codes.get("")
    if outer is None and packed == "-":
        sys.stdout.write(NOT_KEPT + "\n")
        return
    if outer is None:
        outer = codes[""] = compile(zlib.decompress(binascii.a2b_base64(packed)), sys.argv[0], "exec")
        keep()
    exec(outer, {"__name__": "__main__", "KIMI_COMPILE": compiled, "KIMI_KEEP": keep})  # noqa: S102


main()
