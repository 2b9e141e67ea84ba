"""Where the controller keeps its templates compiled between runs: Jinja's bytecode cache.

Jinja compiles a template to Python on first use, about 2 ms each, which every run paid again for
the dozen or more a converge renders (26.6 ms for the 16 templates, against 2.3 ms read back from
the cache on the lab's controller). Jinja keeps each compiled template under a key of its name
and file, and uses it only while the template's source has the same checksum, so a changed
template compiles again. The folder is ``$XDG_CACHE_HOME/kimi-deploy/templates`` (else
``~/.cache/...``), the user's own: a folder that another user could write is not used, since
what it holds runs in the controller.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

import jinja2

from kimi_deploy.controller_dirs import controller_cache


class _Kept(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache, for which a template that cannot be read back or kept (the folder gone,
    a full or read-only disk) is only compiled in the run."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except OSError:
            return

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().dump_bytecode(bucket)
        except OSError:
            return


def bytecode_cache(environ: Mapping[str, str]) -> jinja2.BytecodeCache | None:
    """The templates' bytecode cache in the controller's cache folder, created 0700; None where it
    cannot be made or is not the user's alone (each template then compiles in the run)."""
    folder = controller_cache(environ) / "templates"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None
    return _Kept(str(folder), "%s.jinja")
