"""``kimi-deploy status INVENTORY [PYINFRA OPTIONS]``: what serves where, and a curl to ask it.

The status deploy (``deploys/status.py``: one read-only probe per host), run as ``kimi-deploy
converge INVENTORY --deploy status`` runs it, by the pyinfra installed beside kimi-deploy, with
pyinfra's own informational lines held back (its warnings and errors still said): what prints is
the table and the endpoints, on stdout. ``-v`` (or ``--debug``) keeps all of pyinfra's lines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.converge_command import PYINFRA_MAIN, exec_pyinfra, pyinfra_argv

USAGE = """\
usage: kimi-deploy status INVENTORY [PYINFRA OPTIONS ...]

What serves where: every host's units (systemd state, the watchdog's, the last smoke test), the
release serving and its weights revision, the benchmark figures kept with it, then each topology's
endpoints and a curl that asks it. One read-only probe per host: pyinfra INVENTORY
deploys/status.py -y, with pyinfra's own lines held back but warnings and errors.

  PYINFRA OPTIONS pyinfra's own: --limit HOST, --data KEY=VALUE, --sudo, -v (all of pyinfra's lines), ...
"""
# pyinfra's CLI as the converge starts it, its logger's lines below WARNING dropped first (a filter
# on pyinfra's own logger, before its CLI is imported: nothing of kimi-deploy is imported before
# pyinfra's CLI patches the standard library with gevent)
QUIET = "import logging; logging.getLogger('pyinfra').addFilter(lambda record: record.levelno > logging.INFO)"
PYINFRA_QUIET_MAIN = f"{QUIET}; {PYINFRA_MAIN}"
_VERBOSE = re.compile(r"-v+|--debug.*")


def status_argv(words: Sequence[str], here: Path) -> list[str]:
    """pyinfra's arguments for ``status WORDS`` run in the folder ``here``; ``ConfigError`` naming
    what is missing or wrong."""
    words = list(words)
    if not words or words[0].startswith("-"):
        raise ConfigError("", "INVENTORY", "give the inventory first: kimi-deploy status INVENTORY [options]")
    if any(w == "--deploy" or w.startswith("--deploy=") for w in words):
        raise ConfigError("", "--deploy", "status runs deploys/status.py; kimi-deploy converge --deploy NAME, others")
    return pyinfra_argv([words[0], "--deploy", "status", *words[1:]], here)


def pyinfra_main(argv: Sequence[str]) -> str:
    """The code that starts pyinfra's CLI for ``argv``: quiet unless it asks for pyinfra's lines."""
    return PYINFRA_MAIN if any(_VERBOSE.fullmatch(w) for w in argv) else PYINFRA_QUIET_MAIN


def run_status(words: Sequence[str]) -> int:
    """Replace this process with pyinfra running the status deploy (its exit status is the command's)."""
    if words[:1] in (["-h"], ["--help"]):
        print(USAGE, end="")
        return 0
    argv = status_argv(words, Path.cwd())
    exec_pyinfra(pyinfra_main(argv), argv)
