"""The inventory-wide topology map: one row per host from its HostProfile, and NIC affinities."""

from __future__ import annotations

from typing import Any

from kimi_deploy.host_profile import port_active
from kimi_deploy.hostside.boundary_text import printable

GIB = 2**30


def _accelerators(acc: dict[str, Any]) -> str:
    if acc.get("error"):
        return f"error: {acc['error']}"[:60]
    if not acc.get("count"):
        return "none"
    memory = f" {acc['memory_mib'] // 1024} GiB" if acc.get("memory_mib") else ""
    return f"{acc['count']} x {acc.get('model')}{memory}"


def _links(acc: dict[str, Any]) -> str:
    topo = acc.get("topology") or {}
    matrix: dict[str, dict[str, str]] = topo.get("matrix") or {}
    gpus = [g["name"] for g in topo.get("gpus") or []]
    kinds = sorted({matrix.get(a, {}).get(b, "?") for a in gpus for b in gpus if a != b})
    parts = []
    if kinds:
        parts.append("/".join(kinds))
    if acc.get("nvlink_active"):
        parts.append(f"{acc['nvlink_active']} NVLink up")
    if acc.get("fabric"):
        parts.append("fabric " + ",".join(str(f.get("state")) for f in acc["fabric"][:1]))
    if acc.get("tpu"):
        tpu = acc["tpu"]
        parts.append(f"TPU {tpu.get('generation')} {tpu.get('accelerator_type') or ''}".strip())
    return " ".join(parts) or "-"


def _nics(profile: dict[str, Any]) -> str:
    up = [p for p in profile.get("rdma") or [] if port_active(p)]
    if not profile.get("rdma"):
        return "-"
    # a port whose rate is not known (short ibv_devinfo prints none) adds no rate
    rates = sorted({str(p["rate_gbps"]) for p in up if p.get("rate_gbps") is not None})
    return f"{len(up)}/{len(profile['rdma'])} active" + (f" @{'/'.join(rates)}G" if rates else "")


def _affinity(profile: dict[str, Any]) -> list[str]:
    """For each GPU, the NICs closest to it (PIX/PXB), from the topology matrix."""
    topo = (profile.get("accelerators") or {}).get("topology") or {}
    matrix: dict[str, dict[str, str]] = topo.get("matrix") or {}
    legend: dict[str, str] = topo.get("nic_legend") or {}
    out = []
    for gpu in topo.get("gpus") or []:
        near = [
            legend.get(n["name"]) or n["name"]
            for n in topo.get("nics") or []
            if matrix.get(gpu["name"], {}).get(n["name"]) in ("PIX", "PXB")
        ]
        if near:
            out.append(f"{gpu['name']}->{','.join(near)} (NUMA {gpu.get('numa_affinity')})")
    return out


def format_report(profiles: dict[str, dict[str, Any]]) -> str:
    header = ("HOST", "ACCELERATORS", "LINKS", "RDMA", "RAM", "NUMA", "DISK FREE", "READ", "OS", "DRIVER")
    rows = [header]
    for host, p in profiles.items():
        acc = p.get("accelerators") or {}
        disk = p.get("disk") or {}
        read = disk.get("read_mb_s")
        rows.append(
            (
                host,
                _accelerators(acc),
                _links(acc),
                _nics(p),
                f"{int((p.get('memory') or {}).get('total_bytes') or 0) / GIB:.0f} GiB",
                str(p.get("numa_nodes") or "-"),
                f"{int(disk.get('free_bytes') or 0) / GIB:.1f} GiB {disk.get('fs_type') or ''}".strip(),
                f"{read:.0f} MB/s" if isinstance(read, (int, float)) else "-",
                str((p.get("os") or {}).get("pretty") or "-"),
                str(acc.get("driver_version") or (p.get("drivers") or {}).get("nvidia") or "-"),
            )
        )
    # Each cell is what a host reported (GPU names, driver and OS strings): shown, never acted on.
    shown = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in shown) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in shown]
    for host, p in profiles.items():
        near = _affinity(p)
        if near:
            lines.append(printable(f"{host} GPU-NIC affinity: " + "; ".join(near)))
    return "\n".join(lines) + "\n"
