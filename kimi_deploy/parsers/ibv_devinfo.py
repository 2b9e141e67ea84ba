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
from typing import Any

from kimi_deploy.parsers import ParseError, read_int

# Attribute -> how its value is read: "str" as printed, "enum" without its "(n)" code, "int".
HCA_FIELDS = {
    "transport": "enum",
    "fw_ver": "str",
    "node_guid": "str",
    "sys_image_guid": "str",
    "vendor_id": "str",
    "vendor_part_id": "int",
    "hw_ver": "str",
    "board_id": "str",
    "phys_port_cnt": "int",
}
PORT_FIELDS = {
    "state": "enum",
    "max_mtu": "int",
    "active_mtu": "int",
    "sm_lid": "int",
    "port_lid": "int",
    "port_lmc": "str",
    "link_layer": "str",
    "active_width": "enum",
    "active_speed": "enum",
    "phys_state": "enum",
}
_RENAMED = {"phys_state": "physical_state"}
_INT = re.compile(r"\d+")
_GID = re.compile(r"GID\[\s*\d+\]")
NO_DEVICES = "No IB devices found"


def parse_ibv_devinfo(text: str) -> list[dict[str, Any]]:
    """The HCAs ``ibv_devinfo`` (short or ``-v``) printed in ``text`` (shape in the module docstring)."""
    hcas: list[dict[str, Any]] = []
    port: dict[str, Any] | None = None
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
            if key in HCA_FIELDS or key in PORT_FIELDS:
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
            if key in PORT_FIELDS:
                port[_RENAMED.get(key, key)] = _read(PORT_FIELDS[key], value, f"{where} port {port['port']}: {key}")
            elif _GID.fullmatch(key):
                port["gids"].append(value)
        elif key in HCA_FIELDS:
            hca[key] = _read(HCA_FIELDS[key], value, f"{where}: {key}")
        elif key in PORT_FIELDS:
            raise ParseError(f"{where}: {key} before any 'port:' line")
    if not hcas:
        said = [line.strip() for line in text.splitlines() if line.strip()]
        if NO_DEVICES in said:
            return []
        raise ParseError(f"no 'hca_id:' line (first line: {said[0]!r})" if said else "no output")
    return hcas


def _new_hca(hca_id: str) -> dict[str, Any]:
    hca: dict[str, Any] = {"hca_id": hca_id, **dict.fromkeys(HCA_FIELDS), "ports": []}
    return hca


def _new_port(number: int) -> dict[str, Any]:
    port: dict[str, Any] = {"port": number, **{_RENAMED.get(k, k): None for k in PORT_FIELDS}, "gids": []}
    return port


def _read(kind: str, value: str, where: str) -> str | int:
    if kind == "str":
        return value
    plain = _without_code(value)
    if kind == "enum":
        return plain
    if not _INT.fullmatch(plain):
        raise ParseError(f"{where}: {value!r} is not a number")
    return read_int(plain, where)


def _without_code(value: str) -> str:
    """``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``: a trailing ``(digits)`` and the blanks before it go."""
    opening = value.rfind("(")
    if opening < 0 or not value.endswith(")") or not _INT.fullmatch(value[opening + 1 : -1]):
        return value
    return value[:opening].rstrip()
