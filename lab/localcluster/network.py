"""The cluster's private network: one bridge, and per host a network namespace joined by a veth pair.

Hosts get only the route to their own subnet, no default route: whatever they send to any other
address fails at once with "Network unreachable" instead of leaving the machine. IPv6 is off on
every link so that nothing (router solicitations, MLD) is sent at all beyond what tests ask for.
"""

from __future__ import annotations

import json
from pathlib import Path

from localcluster import log, run
from localcluster.state import Settings

NETNS_DIR = Path("/run/netns")


def _link_exists(name: str, netns: str | None = None) -> bool:
    where = ["-n", netns] if netns else []
    return run(["ip", *where, "link", "show", "dev", name], check=False).returncode == 0


def _ipv4_addresses(name: str, netns: str | None = None) -> set[str]:
    where = ["-n", netns] if netns else []
    out = run(["ip", *where, "-j", "-4", "addr", "show", "dev", name]).stdout
    return {f"{a['local']}/{a['prefixlen']}" for link in json.loads(out or "[]") for a in link.get("addr_info", [])}


def _ipv6_off(name: str, netns: str | None = None) -> None:
    if netns is None:
        knob = Path("/proc/sys/net/ipv6/conf") / name / "disable_ipv6"
        if knob.exists():
            knob.write_text("1\n", encoding="ascii")
        return
    run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"net.ipv6.conf.{name}.disable_ipv6=1"], check=False)


def mac(address: str) -> str:
    """A fixed, locally administered MAC for an address.

    A host made anew keeps the MAC its address had, and the bridge keeps one however its ports come
    and go: nobody's ARP cache then points at a MAC that is gone (which stalls traffic for ~30 s).
    """
    return "02:6b:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))


def _link_mac(name: str, netns: str | None = None) -> str:
    where = ["-n", netns] if netns else []
    links = json.loads(run(["ip", *where, "-j", "link", "show", "dev", name]).stdout or "[]")
    return str(links[0].get("address", "")) if links else ""


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def ensure_bridge(settings: Settings) -> None:
    """The bridge exists, is up and holds the gateway address (the address services bind to)."""
    bridge = settings.bridge
    if not _link_exists(bridge):
        log.info("network: creating bridge %s (%s)", bridge, settings.subnet)
        run(["ip", "link", "add", bridge, "address", mac(settings.gateway), "type", "bridge"])
    if _link_mac(bridge) != mac(settings.gateway):
        run(["ip", "link", "set", bridge, "address", mac(settings.gateway)])
    _ipv6_off(bridge)
    cidr = f"{settings.gateway}/{settings.subnet.prefixlen}"
    if cidr not in _ipv4_addresses(bridge):
        run(["ip", "addr", "add", cidr, "dev", bridge])
    run(["ip", "link", "set", bridge, "up"])


def delete_bridge(settings: Settings) -> None:
    if _link_exists(settings.bridge):
        run(["ip", "link", "delete", settings.bridge, "type", "bridge"])


def ensure_host_link(settings: Settings, name: str, address: str) -> None:
    """Namespace ``netns(name)`` holds ``eth0`` with ``address``, its peer is up on the bridge."""
    netns = settings.netns(name)
    veth = settings.veth(address)
    if not netns_exists(netns):
        run(["ip", "netns", "add", netns])
    if not _link_exists("eth0", netns):
        if _link_exists(veth):
            # Peer left over from a namespace deleted behind our back: start the pair afresh.
            run(["ip", "link", "delete", veth])
        peer = ["peer", "name", "eth0", "address", mac(address), "netns", netns]
        run(["ip", "link", "add", veth, "type", "veth", *peer])
    _ipv6_off(veth)
    _ipv6_off("eth0", netns)
    run(["ip", "link", "set", veth, "master", settings.bridge, "up"])
    cidr = f"{address}/{settings.subnet.prefixlen}"
    if cidr not in _ipv4_addresses("eth0", netns):
        run(["ip", "-n", netns, "addr", "add", cidr, "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])
    run(["ip", "-n", netns, "link", "set", "eth0", "up"])


def delete_host_link(settings: Settings, name: str, address: str) -> None:
    # The veth first: deleting one end deletes both at once, whereas a deleted namespace frees its
    # links later, in the kernel's own time.
    veth = settings.veth(address)
    if _link_exists(veth):
        run(["ip", "link", "delete", veth])
    netns = settings.netns(name)
    if netns_exists(netns):
        run(["ip", "netns", "delete", netns])
