"""The controller keeps its templates compiled between runs, in its own cache folder only."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2

from kimi_deploy.render.files import TEMPLATES
from kimi_deploy.render.template_cache import bytecode_cache


def _env(cache: jinja2.BytecodeCache | None, folder: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), bytecode_cache=cache, autoescape=False)


def test_a_template_compiled_once_is_read_back_and_compiled_again_when_it_changes(tmp_path: Path) -> None:
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "unit.j2").write_text("ExecStart={{ argv }}\n")
    first = _env(bytecode_cache(environ), templates)
    assert first.get_template("unit.j2").render(argv="a") == "ExecStart=a"
    kept = list((tmp_path / "cache" / "kimi-deploy" / "templates").iterdir())
    assert len(kept) == 1
    assert kept[0].name.endswith(".jinja")
    assert (tmp_path / "cache" / "kimi-deploy" / "templates").stat().st_mode & 0o777 == 0o700
    # a new process's environment reads what the first compiled; a changed template compiles again
    assert _env(bytecode_cache(environ), templates).get_template("unit.j2").render(argv="b") == "ExecStart=b"
    (templates / "unit.j2").write_text("ExecStart=changed {{ argv }}\n")
    assert _env(bytecode_cache(environ), templates).get_template("unit.j2").render(argv="c") == "ExecStart=changed c"


def test_a_cache_folder_others_can_write_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "kimi-deploy" / "templates"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert bytecode_cache({"XDG_CACHE_HOME": str(tmp_path)}) is None
    folder.chmod(0o700)
    assert bytecode_cache({"XDG_CACHE_HOME": str(tmp_path)}) is not None


def test_a_cache_that_cannot_be_made_or_written_only_costs_a_compile(tmp_path: Path) -> None:
    (tmp_path / "kimi-deploy").write_text("a file where the folder would be")
    assert bytecode_cache({"XDG_CACHE_HOME": str(tmp_path)}) is None
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    cache = bytecode_cache(environ)
    folder = tmp_path / "cache" / "kimi-deploy" / "templates"
    # a folder the controller can no longer write: the render goes on (root writes anyway: a full disk)
    folder.rmdir()
    folder.write_text("")
    assert _env(cache, TEMPLATES).get_template("json.j2") is not None
    assert os.path.isfile(folder)
