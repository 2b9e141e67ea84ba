"""``kimi-deploy converge INVENTORY [--deploy NAME] [PYINFRA OPTIONS]``: a deploy, run by the
pyinfra installed beside kimi-deploy.

The same as ``pyinfra INVENTORY deploys/NAME.py -y`` (no ``-y`` with ``--dry``) from a folder
``kimi-deploy init`` wrote (or a checkout), but never a pyinfra of another installation, which
cannot import kimi-deploy (pyinfra's docs suggest installing it as a tool of its own). Every
option after INVENTORY but ``--deploy`` is pyinfra's (``--dry``, ``--diff``, ``--limit``,
``--data``, ``-v``, ``--sudo``, ...).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.starter import DEPLOYS

USAGE = """\
usage: kimi-deploy converge INVENTORY [--deploy NAME] [PYINFRA OPTIONS ...]

Run deploys/NAME.py (default: kimi, the converge) on INVENTORY's hosts with the pyinfra installed
beside kimi-deploy: pyinfra INVENTORY deploys/NAME.py -y. From a folder "kimi-deploy init" wrote.

  --deploy NAME   one of: {names}
  PYINFRA OPTIONS pyinfra's own: --dry, --diff, --limit HOST, --data KEY=VALUE, --sudo, -v, ...
"""
# pyinfra's CLI, as its console script starts it (pyinfra's entry point: pyinfra_cli.main:main)
PYINFRA_MAIN = "import sys; from pyinfra_cli.main import main; sys.argv[0] = 'pyinfra'; sys.exit(main())"


def deploy_names() -> list[str]:
    return sorted(p.stem for p in DEPLOYS.glob("*.py") if not p.name.startswith("_"))


def pyinfra_argv(words: Sequence[str], here: Path) -> list[str]:
    """pyinfra's arguments for ``converge WORDS`` run in the folder ``here``; ``ConfigError`` naming
    what is missing or wrong."""
    words = list(words)
    if not words or words[0].startswith("-"):
        raise ConfigError("", "INVENTORY", "give the inventory first: kimi-deploy converge INVENTORY [options]")
    inventory, rest = words[0], words[1:]
    name = "kimi"
    passed: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--deploy":
            if i + 1 >= len(rest):
                raise ConfigError("", "--deploy", "expected a deploy's name")
            name, i = rest[i + 1], i + 2
            continue
        if word.startswith("--deploy="):
            name, i = word.split("=", 1)[1], i + 1
            continue
        passed.append(word)
        i += 1
    if name not in deploy_names():
        raise ConfigError("", "--deploy", f"expected one of {', '.join(deploy_names())}, found {name!r}")
    if not (here / inventory).is_file():
        raise ConfigError(inventory, "", "no such inventory file")
    deploy = f"deploys/{name}.py"
    if not (here / deploy).is_file():
        raise ConfigError(
            str(here / deploy), "", "no such deploy file: run from a folder kimi-deploy init wrote (or a checkout)"
        )
    # pyinfra works out what a dry run would change only where it may prompt: no -y then
    yes = [] if {"-y", "--yes", "--dry"} & set(passed) else ["-y"]
    return [inventory, deploy, *passed, *yes]


def run_converge(words: Sequence[str]) -> int:
    """Replace this process with pyinfra running the deploy (its exit status is the command's)."""
    if words[:1] in (["-h"], ["--help"]):
        print(USAGE.format(names=", ".join(deploy_names())), end="")
        return 0
    exec_pyinfra(PYINFRA_MAIN, pyinfra_argv(words, Path.cwd()))


def exec_pyinfra(main: str, argv: Sequence[str]) -> NoReturn:
    """Replace this process with this interpreter running ``main`` (the code starting pyinfra's
    CLI) on ``argv``."""
    sys.stdout.flush()
    sys.stderr.flush()
    # no shell: the words go to pyinfra as they are
    os.execv(sys.executable, [sys.executable, "-c", main, *argv])  # noqa: S606
