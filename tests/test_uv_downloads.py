"""A release install's bytes, from what uv says as it fetches the wheels (captures: fixtures/uv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_deploy.hostside.uv_downloads import Downloads

UV = Path(__file__).resolve().parent / "fixtures" / "uv"
MiB = 1 << 20


def _read(name: str) -> list[tuple[int, int]]:
    """(done, total) after each line of a capture that changed them."""
    downloads = Downloads()
    return [(downloads.done, downloads.total) for line in (UV / name).read_text().splitlines() if downloads.line(line)]


def test_each_wheel_uv_names_counts_when_it_starts_and_when_it_ends() -> None:
    numpy, scipy = int(15.6 * MiB), int(38.7 * MiB)
    assert _read("pip_sync_numpy-2.2.2_scipy-1.15.1.txt") == [
        (0, numpy),
        (0, numpy + scipy),
        (numpy, numpy + scipy),
        (numpy + scipy, numpy + scipy),
    ]
    # within uv's rounding of the wheels' sizes on the index (SOURCES.md)
    assert abs(numpy + scipy - (16_393_429 + 40_588_469)) < 0.001 * (numpy + scipy)


def test_a_release_of_small_wheels_counts_only_the_one_uv_names() -> None:
    assert _read("pip_sync_huggingface_hub-2.4.0.txt") == [(0, int(4.1 * MiB)), (int(4.1 * MiB), int(4.1 * MiB))]


@pytest.mark.parametrize(
    "line",
    [
        "Resolved 15 packages in 24ms",
        "Prepared 2 packages in 1.00s",
        " + numpy==2.2.2",
        "Downloading numpy",
        "Downloading numpy (15.6 MiB)",
        "Downloading numpy (-15.6MiB)",
        "Downloading numpy (15.6PiB)",
        "Downloading numpy (1e9MiB)",
        "Downloading numpy (9999999.9MiB)",
        "Downloading ../../etc (1.0MiB)",
        "Downloading numpy (15.6MiB) and more",
        "Downloaded scipy",  # never started
        "Downloading " + "a" * 300 + " (1.0MiB)",
        "x" * 100_000,
    ],
)
def test_any_other_line_changes_nothing(line: str) -> None:
    downloads = Downloads()
    assert not downloads.line(line)
    assert (downloads.done, downloads.total) == (0, 0)


def test_a_wheel_named_twice_counts_once() -> None:
    downloads = Downloads()
    assert downloads.line("Downloading torch (846.9MiB)")
    assert not downloads.line("Downloading torch (846.9MiB)")
    assert downloads.line(" Downloaded torch")
    assert not downloads.line(" Downloaded torch")
    assert (downloads.done, downloads.total) == (int(846.9 * MiB), int(846.9 * MiB))
