"""Parsers of hardware command outputs, fed by real captures (``fixtures/SOURCES.md`` says where each is from)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture(name: str) -> str:
    """A capture exactly as stored: tabs, CRLF and escape bytes kept."""
    return (FIXTURES / name).read_bytes().decode("utf-8")
