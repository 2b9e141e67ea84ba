"""The weights sync's progress file: the bytes in and to come while files arrive, gone at the end.

``hostside/weights_sync.py``'s ``Progress`` counts the files placed and the partial ones (a
peer's, the Hub's) against what the sync must fetch, and keeps that in ``<dir>/.kimi/progress``
for the controller's step line (``kimi_pyinfra.progress_reads``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kimi_deploy.host.progress_reading import Reading, parse_progress
from kimi_deploy.hostside import weights_sync
from kimi_deploy.hostside.revision_files import PROGRESS, meta, partial_path


def _reading(path: Path) -> Reading | None:
    return parse_progress(path.read_text(encoding="ascii")) if path.exists() else None


def _until(path: Path, done: int, within_s: float = 5.0) -> Reading | None:
    until = time.monotonic() + within_s
    while (reading := _reading(path)) is None or reading.done != done:
        if time.monotonic() > until:
            break
        time.sleep(0.01)
    return reading


def test_the_file_follows_the_bytes_as_they_arrive_and_goes_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(weights_sync, "PROGRESS_FILE_EVERY_S", 0.02)
    root = tmp_path / "revision"
    (root / ".kimi").mkdir(parents=True)
    (root / "model-00001.safetensors").write_bytes(b"x" * 100)  # already in place: not to fetch
    wanted = {"model-00002.safetensors": 300, "model-00003.safetensors": 700}
    file = Path(meta(str(root), PROGRESS))
    with weights_sync.Progress(None, "weights", str(root), wanted, str(file)):
        # written at once, before the first tick
        first = _reading(file)
        assert first is not None
        assert (first.done, first.total) == (0, 1000)
        partial = Path(partial_path(str(root), "model-00003.safetensors"))
        partial.parent.mkdir(parents=True)
        partial.write_bytes(b"x" * 200)
        assert _until(file, 200) is not None
        (root / "model-00002.safetensors").write_bytes(b"x" * 300)
        reading = _until(file, 500)
        assert reading is not None
        assert (reading.done, reading.total) == (500, 1000)
    assert not file.exists()
    assert sorted(p.name for p in (root / ".kimi").iterdir()) == ["partial"]


def test_nothing_to_fetch_writes_nothing(tmp_path: Path) -> None:
    file = tmp_path / "progress"
    with weights_sync.Progress(str(tmp_path / "weights.log"), "weights", str(tmp_path), {}, str(file)):
        assert not file.exists()
    assert not file.exists()


def test_the_log_keeps_its_own_pace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file every tick, the log's line every ``PROGRESS_EVERY_S`` as before."""
    monkeypatch.setattr(weights_sync, "PROGRESS_FILE_EVERY_S", 0.01)
    monkeypatch.setattr(weights_sync, "PROGRESS_EVERY_S", 0.2)
    log = tmp_path / "weights.log"
    with weights_sync.Progress(str(log), "weights", str(tmp_path), {"a": 10}, str(tmp_path / "progress")):
        time.sleep(0.5)
    lines = log.read_text().splitlines()
    assert 2 <= len(lines) <= 4, lines  # two or three ticks of the log, and the last line
    assert lines[-1].endswith("weights: 0 B of 10 B (0%), 0 B/s, done")
