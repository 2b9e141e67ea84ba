"""Parse ``ibv_devinfo`` and ``ibv_devinfo -v``: each HCA and each of its ports.

:func:`parse_ibv_devinfo` returns one dict per ``hca_id`` block, in output order::

    [{"hca_id": "mlx5_0", "transport": "InfiniBand", "fw_ver": "20.32.1010",
      "node_guid": "0800:3803:00b8:b188", "sys_image_guid": "0800:3803:00b8:b188",
      "vendor_id": "0x119f", "vendor_part_id": 4123, "hw_ver": "0x0", "board_id": "BL_12001644",
      "phys_port_cnt": 1,
      "ports": [{"port": 1, "state": "PORT_ACTIVE", "physical_state": "LINK_UP",
                 "link_layer": "InfiniBand", "active_width": "4X", "active_speed": "10.0 Gbps",
                 "max_mtu": 4096, "active_mtu": 4096, "sm_lid": 24, "port_lid": 386,
                 "port_lmc": "0x00", "gids": []}]}, ...]

- Enumerations lose their code: ``PORT_ACTIVE (4)`` -> ``"PORT_ACTIVE"``, ``4096 (5)`` -> ``4096``.
- ``physical_state`` (from ``phys_state``), ``active_width``, ``active_speed`` and ``gids`` exist only
  in ``-v`` output; in the short form they are None and ``[]``. Any attribute the output does not
  print is None. Every other ``-v`` attribute (device caps, flags) is left out.
- Lines before the first ``hca_id:`` (library warnings) are skipped; an HCA's or a port's attribute
  among them means the output lost its start, and is refused.
- ``No IB devices found``, what ibv_devinfo prints on a host without one (after the library's
  warnings, as a real one printed: ``tests/parsers/fixtures/SOURCES.md``), is the empty list.

Raises :class:`~kimi_deploy.parsers.ParseError` when there is no ``hca_id:`` line (quoting the first
line the tool printed, such as ``Failed to open device``), when a port number or a numeric attribute
is not a number, or when an attribute comes before the ``hca_id:`` or port header it needs.
"""

from __future__ import annotations

import re
from typing import Literal, TypedDict

from kimi_deploy.parsers import ParseError, read_int


class IbvPort(TypedDict):
    """A port of an HCA; None: the output does not print the attribute."""

    port: int
    state: str | None
    max_mtu: int | None
    active_mtu: int | None
    sm_lid: int | None
    port_lid: int | None
    port_lmc: str | None
    link_layer: str | None
    # -v output only, as are the gids
    active_width: str | None
    active_speed: str | None
    physical_state: str | None
    gids: list[str]


class IbvHca(TypedDict):
    """An ``hca_id`` block; None: the output does not print the attribute."""

    hca_id: str
    transport: str | None
    fw_ver: str | None
    node_guid: str | None
    sys_image_guid: str | None
    vendor_id: str | None
    vendor_part_id: int | None
    hw_ver: str | None
    board_id: str | None
    phys_port_cnt: int | None
    ports: list[IbvPort]


HcaText = Literal["transport", "fw_ver", "node_guid", "sys_image_guid", "vendor_id", "hw_ver", "board_id"]
HcaInt = Literal["vendor_part_id", "phys_port_cnt"]
PortText = Literal["state", "port_lmc", "link_layer", "active_width", "active_speed", "physical_state"]
PortInt = Literal["max_mtu", "active_mtu", "sm_lid", "port_lid"]
# How an attribute's value is read: "str" as printed, "enum" without its "(n)" code.
TextKind = Literal["str", "enum"]

# Attribute -> its key, and how its value is read; one table per type of value, so that each key
# is typed. phys_state's key is physical_state.
HCA_TEXT: dict[str, tuple[HcaText, TextKind]] = {
    "transport": ("transport", "enum"),
    "fw_ver": ("fw_ver", "str"),
    "node_guid": ("node_guid", "str"),
    "sys_image_guid": ("sys_image_guid", "str"),
    "vendor_id": ("vendor_id", "str"),
    "hw_ver": ("hw_ver", "str"),
    "board_id": ("board_id", "str"),
}
HCA_INTS: dict[str, HcaInt] = {"vendor_part_id": "vendor_part_id", "phys_port_cnt": "phys_port_cnt"}
PORT_TEXT: dict[str, tuple[PortText, TextKind]] = {
    "state": ("state", "enum"),
    "port_lmc": ("port_lmc", "str"),
    "link_layer": ("link_layer", "str"),
    "active_width": ("active_width", "enum"),
    "active_speed": ("active_speed", "enum"),
    "phys_state": ("physical_state", "enum"),
}
PORT_INTS: dict[str, PortInt] = {
    "max_mtu": "max_mtu",
    "active_mtu": "active_mtu",
    "sm_lid": "sm_lid",
    "port_lid": "port_lid",
}
_HCA_ATTRIBUTES = HCA_TEXT.keys() | HCA_INTS.keys()
_PORT_ATTRIBUTES = PORT_TEXT.keys() | PORT_INTS.keys()
_INT = re.compile(r"\d+")
_GID = re.compile(r"GID\[\s*\d+\]")
NO_DEVICES = "No IB devices found"


def parse_ibv_devinfo(text: str) -> list[IbvHca]:
    """The HCAs ``ibv_devinfo`` (short or ``-v``) printed in ``text`` (shape in the module docstring)."""
    hcas: list[IbvHca] = []
    port: IbvPort | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        # "key: value"; split by hand, since a pattern with lazy groups backtracks over a long line.
        key, colon, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not colon or not key:
            continue  # flag lists and section titles of -v output, blank lines
        if key == "hca_id":
            hcas.append(_new_hca(value))
            port = None
            continue
        if not hcas:
            if key in _HCA_ATTRIBUTES or key in _PORT_ATTRIBUTES:
                raise ParseError(f"line {number}: {key} before any 'hca_id:' line (the output's start is missing)")
            continue
        hca = hcas[-1]
        where = f"hca {hca['hca_id']}"
        if key == "port":
            if not _INT.fullmatch(value):
                raise ParseError(f"{where}: port {value!r} is not a number")
            port = _new_port(read_int(value, f"{where}: port"))
            hca["ports"].append(port)
        elif port is not None:
            if key in PORT_TEXT:
                port_key, kind = PORT_TEXT[key]
                port[port_key] = _text(kind, value)
            elif key in PORT_INTS:
                port[PORT_INTS[key]] = _int(value, f"{where} port {port['port']}: {key}")
            elif _GID.fullmatch(key):
                port["gids"].append(value)
        elif key in HCA_TEXT:
            hca_key, kind = HCA_TEXT[key]
            hca[hca_key] = _text(kind, value)
        elif key in HCA_INTS:
            hca[HCA_INTS[key]] = _int(value, f"{where}: {key}")
        elif key in _PORT_ATTRIBUTES:
            raise ParseError(f"{where}: {key} before any 'port:' line")
    if not hcas:
        said = [line.strip() for line in text.splitlines() if line.strip()]
        if NO_DEVICES in said:
            return []
        raise ParseError(f"no 'hca_id:' line (first line: {said[0]!r})" if said else "no output")
    return hcas


def _new_hca(hca_id: str) -> IbvHca:
    return {
        "hca_id": hca_id,
        "transport": None,
        "fw_ver": None,
        "node_guid": None,
        "sys_image_guid": None,
        "vendor_id": None,
        "vendor_part_id": None,
        "hw_ver": None,
        "board_id": None,
        "phys_port_cnt": None,
        "ports": [],
    }


def _new_port(number: int) -> IbvPort:
    return {
        "port": number,
        "state": None,
        "max_mtu": None,
        "active_mtu": None,
        "sm_lid": None,
        "port_lid": None,
        "port_lmc": None,
        "link_layer": None,
        "active_width": None,
        "active_speed": None,
        "physical_state": None,
        "gids": [],
    }


def _text(kind: TextKind, value: str) -> str:
    return value if kind == "str" else _without_code(value)


def _int(value: str, where: str) -> int:
    plain = _without_code(value)
    if not _INT.fullmatch(plain):
        raise ParseError(f"{where}: {value!r} is not a number")
    return read_int(plain, where)


def _without_code(value: str) -> str:
    """``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``: a trailing ``(digits)`` and the blanks before it go."""
    opening = value.rfind("(")
    if opening < 0 or not value.endswith(")") or not _INT.fullmatch(value[opening + 1 : -1]):
        return value
    return value[:opening].rstrip()
