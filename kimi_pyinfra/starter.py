"""``kimi-deploy init DIR``: a repository of one's own, to run the installed deploys from.

It holds what a user changes (recipes, their locks, inventories) and, in ``deploys/``, one
two-line file per deploy that calls kimi-deploy's own ``@deploy`` function, as installed (the
same files a checkout's ``deploys/`` holds): ``pyinfra inventories/prod.py deploys/kimi.py`` then
runs from DIR exactly as from a checkout. Nothing is overwritten.
"""

from __future__ import annotations

import ast
import contextlib
import os
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_pyinfra.shipped import shipped

# The file tells a pyinfra of another installation (pyinfra's docs suggest installing it as a tool
# of its own, `uv tool install pyinfra`), which cannot import kimi-deploy, what to run instead.
ENTRY = '''"""{summary}

kimi-deploy's own deploy ({function} in kimi_pyinfra/deploys/{name}.py), as installed.
"""

try:
    from kimi_pyinfra.deploys.{name} import {function}
except ModuleNotFoundError as exc:  # a pyinfra of another installation, without kimi-deploy
    if exc.name not in ("kimi_pyinfra", "kimi_pyinfra.deploys"):
        raise
    raise SystemExit(
        "deploys/{name}.py: this pyinfra has no kimi-deploy: run `{command}`"
        " (the pyinfra installed beside kimi-deploy), or that installation's pyinfra"
    ) from None

{function}()
'''
DEPLOYS = Path(__file__).resolve().parent / "deploys"


def deploy_caller(module: Path) -> str:
    """The two-line file that runs the ``@deploy`` function of ``kimi_pyinfra/deploys/<name>.py``
    (``deploy_<name>``), with the first line of its docstring."""
    doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8"))) or f"deploys/{module.name}"
    command = "kimi-deploy converge INVENTORY" + ("" if module.stem == "kimi" else f" --deploy {module.stem}")
    return ENTRY.format(
        summary=doc.splitlines()[0], name=module.stem, function=f"deploy_{module.stem}", command=command
    )


def starter_files() -> dict[str, str]:
    """Every file ``init`` writes, by path relative to DIR."""
    files = {f"deploys/{d.name}": deploy_caller(d) for d in sorted(DEPLOYS.glob("*.py")) if not d.name.startswith("_")}
    for folder in ("recipes", "inventories"):
        base = shipped(folder)
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in (".yaml", ".json", ".py", ".txt") and "__pycache__" not in path.parts:
                files[f"{folder}/{path.relative_to(base)}"] = path.read_text(encoding="utf-8")
    return files


# Every file is new (O_EXCL) and no link is followed where it goes (O_NOFOLLOW): a link planted in
# DIR, dangling or not, makes the write fail instead of landing wherever it points.
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LINKED = "is a symbolic link: kimi-deploy init writes only into folders of DIR itself"


def _checked(target: Path, files: dict[str, str]) -> None:
    """``ConfigError`` naming the first folder that is a symbolic link (DIR or one under it that
    ``files`` go into) or the first file already there (a link included, dangling or not)."""
    folders = {Path(rel).parent for rel in files}
    for folder in sorted({p for f in folders for p in (f, *f.parents)}, key=lambda p: len(p.parts)):
        if (target / folder).is_symlink():
            raise ConfigError(str(target / folder), "", _LINKED)
    for rel in files:
        if os.path.lexists(target / rel):
            raise ConfigError(str(target / rel), "", "already exists: kimi-deploy init writes only new files")


def _open_folder(at: int | None, name: str, shown: Path) -> int:
    """The folder ``name`` (in the folder open as ``at``, else from the working directory), made
    when missing; never through a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o777, dir_fd=at)
    try:
        return os.open(name, _FOLDER, dir_fd=at)
    except OSError as exc:
        if os.path.islink(shown):
            raise ConfigError(str(shown), "", _LINKED) from None
        raise ConfigError(str(shown), "", exc.strerror or "cannot be opened") from None


def init(target: Path) -> list[str]:
    """Write the starter files into ``target``; the paths written. ``ConfigError`` naming the
    first file that is already there, or the first folder that is a symbolic link (``target``
    itself or one the files go into), before anything is written. Every file is created new and
    no link is followed, so nothing is written outside ``target``."""
    files = starter_files()
    _checked(target, files)
    target.parent.mkdir(parents=True, exist_ok=True)
    root = _open_folder(None, str(target), target)
    try:
        for rel, text in files.items():
            *folders, name = Path(rel).parts
            at, opened = root, []
            try:
                for i, folder in enumerate(folders):
                    at = _open_folder(at, folder, target.joinpath(*folders[: i + 1]))
                    opened.append(at)
                _write_new(at, name, text, target / rel)
            finally:
                for fd in opened:
                    os.close(fd)
    finally:
        os.close(root)
    return list(files)


def _write_new(at: int, name: str, text: str, shown: Path) -> None:
    """``text`` as the new file ``name`` in the folder open as ``at``."""
    try:
        fd = os.open(name, _NEW_FILE, 0o666, dir_fd=at)
    except FileExistsError:
        raise ConfigError(str(shown), "", "already exists: kimi-deploy init writes only new files") from None
    except OSError as exc:
        raise ConfigError(str(shown), "", exc.strerror or "cannot be written") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
