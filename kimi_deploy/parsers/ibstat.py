"""Parse ``ibstat``: each channel adapter (CA) and its ports, and the error lines of a failed run.

:func:`parse_ibstat` returns::

    {"cas": [{"name": "mlx5_0", "ca_type": "MT4129", "number_of_ports": 1,
              "firmware_version": "28.39.1002", "hardware_version": "0",
              "node_guid": "0x946dae0300cde72c", "system_image_guid": "0x946dae0300cde72c",
              "ports": [{"port": 1, "state": "Active", "physical_state": "LinkUp", "rate": 400,
                         "base_lid": 75, "lmc": 0, "sm_lid": 334, "capability_mask": "0xa751e848",
                         "port_guid": "0x946dae0300cde72c", "link_layer": "InfiniBand"}]}, ...],
     "errors": ["ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory"]}

- CAs and ports keep the output's order; an attribute the output does not print is None.
  ``rate`` is in Gb/s (int, or float for rates such as 2.5).
- ``errors`` holds, in order, every line that cannot be read as part of a CA block: ``ibstat``
  stops at the first CA it cannot query and prints an ``ibpanic:``/``ibwarn:`` line, so a failed
  run still returns every CA read before it, and its error.

Raises :class:`~kimi_deploy.parsers.ParseError` when no CA block was read at all (the message
quotes the first error line, if any) or when a numeric attribute is not a number.
"""

from __future__ import annotations

import re
from typing import Literal, TypedDict

from kimi_deploy.parsers import ParseError, read_int


class IbstatPort(TypedDict):
    """A port of a CA; None: the output does not print the attribute."""

    port: int
    state: str | None
    physical_state: str | None
    # Gb/s
    rate: int | float | None
    base_lid: int | None
    lmc: int | None
    sm_lid: int | None
    capability_mask: str | None
    port_guid: str | None
    link_layer: str | None


class IbstatCa(TypedDict):
    """A CA block; None: the output does not print the attribute."""

    name: str
    ca_type: str | None
    number_of_ports: int | None
    firmware_version: str | None
    hardware_version: str | None
    node_guid: str | None
    system_image_guid: str | None
    ports: list[IbstatPort]


class Ibstat(TypedDict):
    """What :func:`parse_ibstat` read (shape in the module docstring)."""

    cas: list[IbstatCa]
    errors: list[str]


CaText = Literal["ca_type", "firmware_version", "hardware_version", "node_guid", "system_image_guid"]
CaInt = Literal["number_of_ports"]
PortText = Literal["state", "physical_state", "capability_mask", "port_guid", "link_layer"]
PortInt = Literal["base_lid", "lmc", "sm_lid"]

# Printed label -> key, a table per type of value so that each key is typed: text kept as printed,
# and ints; the one other label is a port's Rate (an int, or a float for rates such as 2.5).
CA_TEXT: dict[str, CaText] = {
    "CA type": "ca_type",
    "Firmware version": "firmware_version",
    "Hardware version": "hardware_version",
    "Node GUID": "node_guid",
    "System image GUID": "system_image_guid",
}
CA_INTS: dict[str, CaInt] = {"Number of ports": "number_of_ports"}
PORT_TEXT: dict[str, PortText] = {
    "State": "state",
    "Physical state": "physical_state",
    "Capability mask": "capability_mask",
    "Port GUID": "port_guid",
    "Link layer": "link_layer",
}
PORT_INTS: dict[str, PortInt] = {"Base lid": "base_lid", "LMC": "lmc", "SM lid": "sm_lid"}
PORT_RATE = "Rate"
_CA = re.compile(r"CA '([^']+)'")
_PORT = re.compile(r"Port (\d+):")
_INT = re.compile(r"\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_ibstat(text: str) -> Ibstat:
    """The CAs and error lines ``ibstat`` printed in ``text`` (shape in the module docstring)."""
    cas: list[IbstatCa] = []
    errors: list[str] = []
    port: IbstatPort | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        ca = _CA.fullmatch(stripped)
        indented = line[0] in " \t"
        if ca and not indented:
            cas.append(_new_ca(ca.group(1)))
            port = None
            continue
        if not indented or not cas:
            errors.append(stripped)
            continue
        number = _PORT.fullmatch(stripped)
        if number:
            port = _new_port(read_int(number.group(1), f"CA {cas[-1]['name']}: Port"))
            cas[-1]["ports"].append(port)
            continue
        label, colon, value = stripped.partition(":")
        label, value = label.strip(), value.strip()
        where = f"CA {cas[-1]['name']}: {label}"
        if not colon:
            errors.append(stripped)
        elif port is not None:
            if label in PORT_TEXT:
                port[PORT_TEXT[label]] = value
            elif label in PORT_INTS:
                port[PORT_INTS[label]] = _int(value, where)
            elif label == PORT_RATE:
                port["rate"] = _number(value, where)
            else:
                errors.append(stripped)
        elif label in CA_TEXT:
            cas[-1][CA_TEXT[label]] = value
        elif label in CA_INTS:
            cas[-1][CA_INTS[label]] = _int(value, where)
        else:
            errors.append(stripped)
    if not cas:
        first = f": {errors[0]}" if errors else ""
        raise ParseError(f"no CA block{first}")
    return {"cas": cas, "errors": errors}


def _new_ca(name: str) -> IbstatCa:
    return {
        "name": name,
        "ca_type": None,
        "number_of_ports": None,
        "firmware_version": None,
        "hardware_version": None,
        "node_guid": None,
        "system_image_guid": None,
        "ports": [],
    }


def _new_port(number: int) -> IbstatPort:
    return {
        "port": number,
        "state": None,
        "physical_state": None,
        "rate": None,
        "base_lid": None,
        "lmc": None,
        "sm_lid": None,
        "capability_mask": None,
        "port_guid": None,
        "link_layer": None,
    }


def _int(value: str, where: str) -> int:
    if not _INT.fullmatch(value):
        raise ParseError(f"{where}: {value!r} is not a number")
    return read_int(value, where)


def _number(value: str, where: str) -> int | float:
    if not _NUMBER.fullmatch(value):
        raise ParseError(f"{where}: {value!r} is not a number")
    return float(value) if "." in value else read_int(value, where)
