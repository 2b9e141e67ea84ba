"""The TCP sockets that listen on some ports, read from the kernel's socket diagnostics (netlink
``sock_diag``, as ``ss -lt`` reads them) rather than ``/proc/net/tcp`` and ``/proc/net/tcp6``.

Reading those two files costs the state probe some 2.3 ms of CPU on every run: the kernel walks
its whole table of established connections for them (262,144 buckets on the lab's machine, and
the table grows with the memory), in every network namespace alike. A dump of the listening
sockets alone walks only the listeners: some 0.1 ms. Both list the sockets of this network
namespace, IPv4 and IPv6 apart, with the same port and inode (the kernel's ``inet_sport`` and
``sock_i_ino``: ``tcp4_seq_show`` prints them, ``inet_diag_msg_common_fill`` and
``inet_sk_diag_fill`` send them). ``listening`` says None when the kernel answers anything but a
whole dump (no sock_diag for TCP, a refused socket, an error part-way): the caller reads the files
then, as before.

``_socket`` rather than ``socket``: the latter's enums cost every probe a millisecond to import.
"""

from __future__ import annotations

import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
IPPROTO_TCP = 6
TCP_LISTEN = 10
AF_INET, AF_INET6 = 2, 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, seq, pid
# struct inet_diag_req_v2: family, protocol, extensions, pad, states; then struct inet_diag_sockid
# (48 bytes: ports, addresses, interface, cookie), all zero: every listener
_REQUEST = struct.Struct("=BBBBI48x")
# struct inet_diag_msg: family, state, timer, retransmits (1 byte each), sockid (the source port
# first, big-endian), expires, rqueue, wqueue, uid, inode (4 bytes each)
_SPORT = struct.Struct(">H")
_SPORT_AT = 4
_INODE = struct.Struct("=I")
_INODE_AT = 4 + 48 + 4 * 4


def _dump(family: int) -> dict[str, int] | None:
    """inode -> port of every TCP socket of ``family`` listening in this network namespace."""
    import _socket  # noqa: PLC0415 - only the state part reads listeners

    try:
        sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    try:
        body = _REQUEST.pack(family, IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
        sock.settimeout(2.0)
        sock.sendto(
            _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body, (0, 0)
        )
        found: dict[str, int] = {}
        while True:
            data = sock.recv(1 << 16)
            if not data:
                return None
            at = 0
            while at + _HEADER.size <= len(data):
                length, kind, _, seq, _ = _HEADER.unpack_from(data, at)
                if length < _HEADER.size or at + length > len(data) or seq != 1:
                    return None
                if kind == NLMSG_DONE:
                    return found
                if kind != SOCK_DIAG_BY_FAMILY or length < _HEADER.size + _INODE_AT + 4:
                    return None  # NLMSG_ERROR, or a message of another kind: not a whole dump
                message = at + _HEADER.size
                if data[message] == family and data[message + 1] == TCP_LISTEN:
                    port = _SPORT.unpack_from(data, message + _SPORT_AT)[0]
                    found[str(_INODE.unpack_from(data, message + _INODE_AT)[0])] = port
                at += (length + 3) & ~3
    except OSError:
        return None
    finally:
        sock.close()


def listening(ports: set[int]) -> dict[str, int] | None:
    """inode (as ``/proc/net/tcp`` prints it) -> port, of every TCP socket listening on one of
    ``ports`` in this network namespace, IPv4 and IPv6; None when the kernel does not say it whole."""
    found: dict[str, int] = {}
    for family in (AF_INET, AF_INET6):
        sockets = _dump(family)
        if sockets is None:
            return None
        found.update((inode, port) for inode, port in sockets.items() if port in ports)
    return found
