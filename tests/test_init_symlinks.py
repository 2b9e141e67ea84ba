"""``kimi-deploy init DIR`` writes inside DIR only: a symbolic link in DIR (a dangling one where a
file goes, a folder it writes into) or DIR itself as a link is refused in one line, before anything
is written through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_pyinfra.cli import main


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _init(target: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["init", str(target)])
    _, err = capsys.readouterr()
    return code, err


def test_a_dangling_link_where_a_file_goes_is_refused_and_nothing_is_written_through_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, outside = tmp_path / "mine", tmp_path / "outside"
    (target / "deploys").mkdir(parents=True)
    outside.mkdir()
    (target / "deploys" / "kimi.py").symlink_to(outside / "planted.py")
    code, err = _init(target, capsys)
    assert code != 0
    assert err.splitlines() == [
        f"{target / 'deploys' / 'kimi.py'}: already exists: kimi-deploy init writes only new files"
    ]
    assert _files(outside) == []


def test_a_linked_folder_inside_dir_is_refused_and_nothing_is_written_outside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, outside = tmp_path / "mine", tmp_path / "outside"
    target.mkdir()
    outside.mkdir()
    (target / "recipes").symlink_to(outside, target_is_directory=True)
    code, err = _init(target, capsys)
    assert code != 0
    assert err.splitlines() == [
        f"{target / 'recipes'}: is a symbolic link: kimi-deploy init writes only into folders of DIR itself"
    ]
    assert _files(outside) == []
    assert _files(target) == ["recipes"]  # refused before anything was written


def test_dir_itself_a_link_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "mine").symlink_to(real, target_is_directory=True)
    code, err = _init(tmp_path / "mine", capsys)
    assert code != 0
    assert err.splitlines() == [
        f"{tmp_path / 'mine'}: is a symbolic link: kimi-deploy init writes only into folders of DIR itself"
    ]
    assert _files(real) == []
