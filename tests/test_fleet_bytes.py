"""The bytes part of a step's tick line: the hosts' readings summed, the rate, the ETA, the slowest."""

from __future__ import annotations

import pytest

from kimi_deploy.host.fleet_bytes import WINDOW_S, FleetBytes, duration, size
from kimi_deploy.host.progress_reading import Reading

TB = 10**12
GB = 10**9


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "0 B"),
        (640, "640 B"),
        (999, "999 B"),
        (1000, "1.00 kB"),
        (6_233_480, "6.23 MB"),
        (412_300_000_000, "412.3 GB"),
        (1_560_000_000_000, "1.56 TB"),
        (35_880_000_000_000, "35.9 TB"),
        (999_960, "1.00 MB"),  # rounded up into the next unit, not "1000.0 kB"
        (9_996_000, "10.0 MB"),
        (-5, "0 B"),
        (10**21, "1000.0 EB"),
    ],
)
def test_sizes_read_in_decimal_units(n: int, said: str) -> None:
    assert size(n) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0, "0 s"), (45.4, "45 s"), (59.6, "1 min"), (725, "12 min 5 s"), (7800, "2 h 10 min"), (90_061, "25 h 1 min")],
)
def test_durations_read_as_an_operator_says_them(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def _same(done: dict[str, int], total: int = 1_560_000_000_000, at: int = 1000) -> dict[str, Reading]:
    return {name: Reading(d, total, at) for name, d in done.items()}


def test_hosts_with_as_much_to_fetch_read_as_one_size_times_the_hosts() -> None:
    moved = FleetBytes()
    hosts = {f"kimi-h{i}": 20 * GB for i in range(1, 24)}
    hosts["kimi-h12"] = int(0.08 * 1_560 * GB)
    first = moved.tick(0.0, _same(hosts), finished=set(), failed=set())
    # one reading: no rate yet
    assert first == f"{sum(hosts.values()) / GB:.1f} GB of 35.9 TB (1.56 TB x 23 hosts); slowest kimi-h1 (1%)"
    later = {name: done + 30 * GB for name, done in hosts.items()}  # 23 x 30 GB in 15 s
    said = moved.tick(15.0, _same(later, at=1015), finished=set(), failed=set())
    assert said is not None
    assert said.startswith(f"{size(sum(later.values()))} of 35.9 TB (1.56 TB x 23 hosts), 46.0 GB/s, ETA ")
    left = 23 * 1_560 * GB - sum(later.values())
    assert f", ETA {duration(left / (46 * GB))};" in said
    assert said.endswith("; slowest kimi-h1 (3%)")


def test_hosts_with_different_amounts_read_as_the_sum_over_the_hosts() -> None:
    moved = FleetBytes()
    readings = {"kimi-h1": Reading(1 * TB, 2 * TB, 5), "kimi-h2": Reading(100 * GB, 500 * GB, 5)}
    assert (
        moved.tick(0.0, readings, finished=set(), failed=set())
        == "1.10 TB of 2.50 TB over 2 hosts; slowest kimi-h2 (20%)"
    )


def test_a_host_that_ended_counts_whole_and_is_never_the_slowest() -> None:
    moved = FleetBytes()
    moved.tick(0.0, {"a": Reading(10, 100, 1), "b": Reading(50, 100, 1)}, finished=set(), failed=set())
    # b ended: its file is gone (no reading this tick), its bytes all count
    said = moved.tick(10.0, {"a": Reading(20, 100, 2)}, finished={"b"}, failed=set())
    assert said == "120 B of 200 B (100 B x 2 hosts), 6 B/s, ETA 13 s; slowest a (20%)"
    assert moved.tick(20.0, {}, finished={"a", "b"}, failed=set()) == "200 B of 200 B (100 B x 2 hosts), 7 B/s"


def test_a_host_that_failed_counts_for_nothing_and_the_rate_never_goes_below_zero() -> None:
    moved = FleetBytes()
    moved.tick(0.0, {"a": Reading(10, 100, 1), "b": Reading(90, 100, 1)}, finished=set(), failed=set())
    said = moved.tick(10.0, {"a": Reading(10, 100, 2)}, finished=set(), failed={"b"})
    assert said == "10 B of 100 B (100 B x 1 host), 0 B/s; slowest a (10%)"


def test_the_rate_is_over_the_last_window_of_readings() -> None:
    moved = FleetBytes()
    for t in range(0, 301, 15):
        # 1 GB/s for the first three minutes, 10 GB/s after
        done = t * GB if t <= 180 else 180 * GB + (t - 180) * 10 * GB
        said = moved.tick(float(t), {"a": Reading(done, 10 * TB, t)}, finished=set(), failed=set())
    assert said is not None
    assert ", 10.0 GB/s, " in said
    assert moved.samples[-1][0] - moved.samples[0][0] == WINDOW_S


def test_a_reading_older_than_the_one_before_changes_nothing() -> None:
    moved = FleetBytes()
    moved.tick(0.0, {"a": Reading(50, 100, 200)}, finished=set(), failed=set())
    # the file a killed earlier run left, read late: written before the reading already taken
    said = moved.tick(10.0, {"a": Reading(99, 100, 100)}, finished=set(), failed=set())
    assert said == "50 B of 100 B (100 B x 1 host), 0 B/s; slowest a (50%)"


def test_no_reading_says_nothing_and_an_empty_total_is_no_reading() -> None:
    moved = FleetBytes()
    assert moved.tick(0.0, {}, finished=set(), failed=set()) is None
    # a release whose uv named no download yet
    assert moved.tick(1.0, {"a": Reading(0, 0, 1)}, finished=set(), failed=set()) is None
    assert moved.readings == {}


def test_what_is_kept_stays_bounded_however_long_the_step() -> None:
    moved = FleetBytes()
    for t in range(100_000):
        moved.tick(float(t), {"a": Reading(t, 10**9, t)}, finished=set(), failed=set())
    assert len(moved.samples) <= 256
    assert list(moved.readings) == ["a"]


def test_a_host_with_all_its_bytes_is_not_the_slowest_while_it_installs() -> None:
    moved = FleetBytes()
    readings = {"kimi-h1": Reading(100, 100, 1), "kimi-h2": Reading(40, 100, 1)}
    assert (
        moved.tick(0.0, readings, finished=set(), failed=set())
        == "140 B of 200 B (100 B x 2 hosts); slowest kimi-h2 (40%)"
    )
    readings = {"kimi-h1": Reading(100, 100, 2), "kimi-h2": Reading(100, 100, 2)}
    assert moved.tick(10.0, readings, finished=set(), failed=set()) == "200 B of 200 B (100 B x 2 hosts), 6 B/s"
