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
from typing import Any

from kimi_deploy.parsers import ParseError, read_int

# Printed label -> (key, "str" | "int" | "number").
CA_FIELDS = {
    "CA type": ("ca_type", "str"),
    "Number of ports": ("number_of_ports", "int"),
    "Firmware version": ("firmware_version", "str"),
    "Hardware version": ("hardware_version", "str"),
    "Node GUID": ("node_guid", "str"),
    "System image GUID": ("system_image_guid", "str"),
}
PORT_FIELDS = {
    "State": ("state", "str"),
    "Physical state": ("physical_state", "str"),
    "Rate": ("rate", "number"),
    "Base lid": ("base_lid", "int"),
    "LMC": ("lmc", "int"),
    "SM lid": ("sm_lid", "int"),
    "Capability mask": ("capability_mask", "str"),
    "Port GUID": ("port_guid", "str"),
    "Link layer": ("link_layer", "str"),
}
_CA = re.compile(r"CA '([^']+)'")
_PORT = re.compile(r"Port (\d+):")
_INT = re.compile(r"\d+")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def parse_ibstat(text: str) -> dict[str, Any]:
    """The CAs and error lines ``ibstat`` printed in ``text`` (shape in the module docstring)."""
    cas: list[dict[str, Any]] = []
    errors: list[str] = []
    port: dict[str, Any] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        ca = _CA.fullmatch(stripped)
        indented = line[0] in " \t"
        if ca and not indented:
            cas.append({"name": ca.group(1), **{key: None for key, _ in CA_FIELDS.values()}, "ports": []})
            port = None
            continue
        if not indented or not cas:
            errors.append(stripped)
            continue
        number = _PORT.fullmatch(stripped)
        if number:
            port = {
                "port": read_int(number.group(1), f"CA {cas[-1]['name']}: Port"),
                **{key: None for key, _ in PORT_FIELDS.values()},
            }
            cas[-1]["ports"].append(port)
            continue
        label, colon, value = stripped.partition(":")
        fields = PORT_FIELDS if port is not None else CA_FIELDS
        if not colon or label.strip() not in fields:
            errors.append(stripped)
            continue
        key, kind = fields[label.strip()]
        target = port if port is not None else cas[-1]
        target[key] = _read(kind, value.strip(), f"CA {cas[-1]['name']}: {label.strip()}")
    if not cas:
        first = f": {errors[0]}" if errors else ""
        raise ParseError(f"no CA block{first}")
    return {"cas": cas, "errors": errors}


def _read(kind: str, value: str, where: str) -> str | int | float:
    if kind == "str":
        return value
    pattern = _INT if kind == "int" else _NUMBER
    if not pattern.fullmatch(value):
        raise ParseError(f"{where}: {value!r} is not a number")
    return float(value) if "." in value else read_int(value, where)
