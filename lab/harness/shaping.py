"""Links of a local cluster shaped with tc tbf (the kernel's token bucket filter), for benchmarks
that measure transfers at a known rate. tbf shapes egress: the bridge device carries what the
hosts receive from the cluster's services (the Hub), the machine's end of a host's veth what
that host receives, and the host's own end (``eth0`` inside it) what it sends."""

from __future__ import annotations

import subprocess


def _tbf(mbit: float) -> list[str]:
    # A burst of at least rate/HZ keeps tbf accurate; latency bounds the queue.
    burst = max(32_000, int(mbit * 1_000_000) // 8 // 100)
    return ["tbf", "rate", f"{int(mbit * 1000)}kbit", "burst", str(burst), "latency", "500ms"]


def tbf_argv(device: str, mbit: float | None) -> list[str]:
    """The tc command shaping ``device``'s egress to ``mbit`` Mbit/s (None: removing it). tbf
    shapes what leaves a device only: a host's uplink is its own end of its veth pair."""
    if mbit is None:
        return ["tc", "qdisc", "del", "dev", device, "root"]
    return ["tc", "qdisc", "replace", "dev", device, "root", *_tbf(mbit)]


def tbf(device: str, mbit: float | None) -> None:
    """Shape ``device``'s egress (on this machine) to ``mbit`` Mbit/s; None removes the shaping."""
    subprocess.run(tbf_argv(device, mbit), check=mbit is not None, capture_output=mbit is None)


def shaped_from_ports(device: str, ports: tuple[int, ...], mbit: float) -> None:
    """Shape only what leaves ``device`` from TCP source ``ports`` (the Hub's answers and its CDN's
    on the bridge), together, to ``mbit`` Mbit/s: an htb qdisc (these machines' kernels have htb
    and tbf, not prio) whose class 1:1, chosen by u32 filters on the source port, has the rate;
    everything else (the controller's SSH) takes class 1:2, unshaped. ``tbf(device, None)`` removes it."""
    rate = f"{int(mbit * 1000)}kbit"
    burst = str(max(32_000, int(mbit * 1_000_000) // 8 // 100))
    for argv in (
        ["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "htb", "default", "2", "r2q", "10000"],
        [
            "tc",
            "class",
            "add",
            "dev",
            device,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            rate,
            "ceil",
            rate,
            "burst",
            burst,
        ],
        ["tc", "class", "add", "dev", device, "parent", "1:", "classid", "1:2", "htb", "rate", "10gbit"],
        *(
            [
                "tc",
                "filter",
                "add",
                "dev",
                device,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "sport",
                str(port),
                "0xffff",
                "flowid",
                "1:1",
            ]
            for port in ports
        ),
    ):
        subprocess.run(argv, check=True)
