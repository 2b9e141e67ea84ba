"""``kimi-deploy init DIR``: a repository of one's own, to run the installed deploys from.

It holds what a user changes (recipes, their locks, inventories) and, in ``deploys/``, one small
file per deploy that includes kimi-deploy's own, as installed: ``pyinfra inventories/prod.py
deploys/kimi.py`` then runs from DIR exactly as from a checkout. Nothing is overwritten.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.shipped import shipped

ENTRY = '''"""{summary}

kimi-deploy's own deploys/{name}, as installed (written by ``kimi-deploy init``).
"""

from kimi_pyinfra.shipped import run_deploy

run_deploy("{name}")
'''


def _summary(deploy: Path) -> str:
    """The first line of a deploy's docstring."""
    doc = ast.get_docstring(ast.parse(deploy.read_text(encoding="utf-8"))) or f"deploys/{deploy.name}"
    return doc.splitlines()[0]


def starter_files() -> dict[str, str]:
    """Every file ``init`` writes, by path relative to DIR."""
    files = {
        f"deploys/{d.name}": ENTRY.format(summary=_summary(d), name=d.name)
        for d in sorted(shipped("deploys").glob("*.py"))
        if not d.name.startswith("_")
    }
    for folder in ("recipes", "inventories"):
        base = shipped(folder)
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in (".yaml", ".json", ".py") and "__pycache__" not in path.parts:
                files[f"{folder}/{path.relative_to(base)}"] = path.read_text(encoding="utf-8")
    return files


def init(target: Path) -> list[str]:
    """Write the starter files into ``target``; the paths written. ``ConfigError`` naming the
    first file that is already there, before anything is written."""
    files = starter_files()
    for rel in files:
        if (target / rel).exists():
            raise ConfigError(str(target / rel), "", "already exists: kimi-deploy init writes only new files")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(files)
