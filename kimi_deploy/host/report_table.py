"""The inventory-wide topology map: one row per host from its HostProfile, and NIC affinities."""

from __future__ import annotations

from kimi_deploy.host.profile import port_active
from kimi_deploy.host.profile_types import Accelerators, HostProfile
from kimi_deploy.hostside.boundary_text import printable

GIB = 2**30


def _accelerators(acc: Accelerators) -> str:
    if acc["error"]:
        return f"error: {acc['error']}"[:60]
    if not acc["count"]:
        return "none"
    memory = f" {acc['memory_mib'] // 1024} GiB" if acc["memory_mib"] else ""
    return f"{acc['count']} x {acc['model']}{memory}"


def _links(acc: Accelerators) -> str:
    topo = acc["topology"]
    matrix = topo["matrix"] if topo else {}
    gpus = [g["name"] for g in topo["gpus"]] if topo else []
    kinds = sorted({matrix.get(a, {}).get(b, "?") for a in gpus for b in gpus if a != b})
    parts = []
    if kinds:
        parts.append("/".join(kinds))
    if acc["nvlink_active"]:
        parts.append(f"{acc['nvlink_active']} NVLink up")
    if acc["fabric"]:
        parts.append("fabric " + ",".join(str(f.get("state")) for f in acc["fabric"][:1]))
    if acc["tpu"]:
        tpu = acc["tpu"]
        parts.append(f"TPU {tpu['generation']} {tpu['accelerator_type'] or ''}".strip())
    return " ".join(parts) or "-"


def _nics(profile: HostProfile) -> str:
    up = [p for p in profile["rdma"] if port_active(p)]
    if not profile["rdma"]:
        return "-"
    # a port whose rate is not known (short ibv_devinfo prints none) adds no rate
    rates = sorted({str(p["rate_gbps"]) for p in up if p["rate_gbps"] is not None})
    return f"{len(up)}/{len(profile['rdma'])} active" + (f" @{'/'.join(rates)}G" if rates else "")


def _affinity(profile: HostProfile) -> list[str]:
    """For each GPU, the NICs closest to it (PIX/PXB), from the topology matrix."""
    topo = profile["accelerators"]["topology"]
    if topo is None:
        return []
    matrix, legend = topo["matrix"], topo["nic_legend"]
    out = []
    for gpu in topo["gpus"]:
        near = [
            legend.get(n["name"]) or n["name"]
            for n in topo["nics"]
            if matrix.get(gpu["name"], {}).get(n["name"]) in ("PIX", "PXB")
        ]
        if near:
            out.append(f"{gpu['name']}->{','.join(near)} (NUMA {gpu.get('numa_affinity')})")
    return out


def format_report(profiles: dict[str, HostProfile]) -> str:
    header = ("HOST", "ACCELERATORS", "LINKS", "RDMA", "RAM", "NUMA", "DISK FREE", "READ", "OS", "DRIVER")
    rows = [header]
    for host, p in profiles.items():
        acc, disk = p["accelerators"], p["disk"]
        read = disk["read_mb_s"]
        rows.append(
            (
                host,
                _accelerators(acc),
                _links(acc),
                _nics(p),
                f"{(p['memory']['total_bytes'] or 0) / GIB:.0f} GiB",
                str(p["numa_nodes"] or "-"),
                f"{(disk['free_bytes'] or 0) / GIB:.1f} GiB {disk['fs_type'] or ''}".strip(),
                f"{read:.0f} MB/s" if read is not None else "-",
                p["os"]["pretty"] or "-",
                acc["driver_version"] or p["drivers"]["nvidia"] or "-",
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
