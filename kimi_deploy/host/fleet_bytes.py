"""The bytes of one step at fleet size: every busy host's progress summed into part of one line.

``412.3 GB of 1.56 TB x 23 hosts, 1.90 GB/s, ETA 2 h 10 min; slowest kimi-h12 (8%)``: the bytes
done and in all over the hosts that said how far they are (``x N hosts`` when each has as many to
fetch, ``over N hosts`` otherwise), the rate over the last ``WINDOW_S`` seconds of readings, the
time left at that rate, and the host least far along of those with bytes still to come. A host
that ended the step counts as having all its bytes (it removes its file when it ends, and the
last reading was before); a host that failed counts for nothing. What is kept grows with the
hosts that reported, one reading each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from kimi_deploy.host.progress_reading import Reading

# The rate is over the readings of the last minute (four ticks of 15 s).
WINDOW_S = 60.0
_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB")


def size(n: float) -> str:
    """``n`` bytes in decimal units: ``412.3 GB``, ``1.56 TB``, ``640 B``."""
    value, unit = float(max(n, 0)), 0
    while unit < len(_UNITS) - 1 and round(value, 2 if value < 10 else 1) >= 1000:
        value, unit = value / 1000, unit + 1
    if unit == 0:
        return f"{int(value)} B"
    return f"{value:.2f} {_UNITS[unit]}" if value < 9.995 else f"{value:.1f} {_UNITS[unit]}"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min 5 s``, ``2 h 10 min``."""
    s = round(max(seconds, 0))
    if s < 60:
        return f"{s} s"
    minutes, s = divmod(s, 60)
    if minutes < 60:
        return f"{minutes} min {s} s" if s else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@dataclass
class FleetBytes:
    """One step's readings, host by host, and the sums of the last ``WINDOW_S`` seconds."""

    readings: dict[str, Reading] = field(default_factory=dict)
    # (when, bytes done over the hosts): the oldest is the rate's start
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=256))

    def tick(
        self, now: float, readings: Mapping[str, Reading], finished: Collection[str], failed: Collection[str]
    ) -> str | None:
        """Take this tick's ``readings`` (host name -> reading; ``now``: the controller's clock,
        seconds) and say the sums, or None when no host has said how far it is."""
        for name, reading in readings.items():
            before = self.readings.get(name)
            # a reading older than the one before it (a file a host left, read late) changes nothing
            if reading.total > 0 and (before is None or reading.time >= before.time):
                self.readings[name] = reading
        counted = {name: r for name, r in self.readings.items() if name not in failed}
        if not counted:
            return None
        done = sum(r.total if name in finished else r.done for name, r in counted.items())
        total = sum(r.total for r in counted.values())
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= WINDOW_S:
            self.samples.popleft()

        hosts = f"{len(counted)} host{'s' if len(counted) != 1 else ''}"
        totals = {r.total for r in counted.values()}
        # "412 GB of 35.9 TB (1.56 TB x 23 hosts)"; "1.10 TB of 2.50 TB over 2 hosts" when they differ
        said = f"{size(done)} of {size(total)} " + (
            f"({size(totals.pop())} x {hosts})" if len(totals) == 1 else f"over {hosts}"
        )
        since, then = self.samples[0]
        if now > since:
            rate = max(done - then, 0) / (now - since)
            said += f", {size(rate)}/s"
            if rate > 0 and total > done:
                said += f", ETA {duration((total - done) / rate)}"
        # (a host with all its bytes in is still at work: installing, verifying; it is not slow)
        busy = [(r.done / r.total, name) for name, r in counted.items() if name not in finished and r.done < r.total]
        if busy:
            part, name = min(busy)
            said += f"; slowest {name} ({int(part * 100)}%)"
        return said
