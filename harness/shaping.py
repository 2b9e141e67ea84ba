"""Links of a local cluster shaped with tc tbf (the kernel's token bucket filter), for benchmarks
that measure transfers at a known rate. tbf shapes egress: the bridge device carries what the
hosts receive from the cluster's services (the Hub), the machine's end of a host's veth what
that host receives, and the host's own end (``eth0`` inside it) what it sends."""

from __future__ import annotations

import subprocess


def tbf_argv(device: str, mbit: int | None) -> list[str]:
    """The tc command shaping ``device``'s egress to ``mbit`` Mbit/s (None: removing it). tbf
    shapes what leaves a device only: a host's uplink is its own end of its veth pair."""
    if mbit is None:
        return ["tc", "qdisc", "del", "dev", device, "root"]
    # A burst of at least rate/HZ keeps tbf accurate; latency bounds the queue.
    burst = max(32_000, mbit * 1_000_000 // 8 // 100)
    return ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{mbit}mbit", "burst", str(burst),
            "latency", "500ms"]  # fmt: skip


def tbf(device: str, mbit: int | None) -> None:
    """Shape ``device``'s egress (on this machine) to ``mbit`` Mbit/s; None removes the shaping."""
    subprocess.run(tbf_argv(device, mbit), check=mbit is not None, capture_output=mbit is None)
