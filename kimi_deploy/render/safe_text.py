"""Text that may reach a host's files: no control characters, and addresses that are addresses.

Unit files, environment files and the plan's other files are read line by line: a line break in
a value starts a line of its own, which systemd reads as a setting (``ExecStartPre=+...`` runs as
root). So every string of a recipe and of an inventory's ``kimi_*`` data is refused when it holds
a control character (C0, DEL, C1, and the Unicode line and paragraph separators), where it is
read, with one line naming the field; rendering refuses one again whatever path it took
(``kimi_deploy.render.files``). An address (``kimi_address``, the host a fallback URL names) is an IP
address or a DNS hostname.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from kimi_deploy.hostside.boundary_text import control_char, shown

_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def refuse_control(value: Any) -> Any:
    """``value`` unchanged when no string in it (lists and mappings looked into, keys included)
    holds a control character; else ``ValueError`` naming the character and where it is."""
    found = _first_control(value, "")
    if found is None:
        return value
    where, char, text = found
    prefix = f"{where}: " if where else ""
    raise ValueError(f"{prefix}control character {char} is refused in text that reaches a host's files, found {text}")


def _first_control(value: Any, where: str) -> tuple[str, str, str] | None:
    if isinstance(value, str):
        char = control_char(value)
        return (where, char, shown(value)) if char else None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _first_control(item, f"{where}[{index}]")
            if found:
                return found
    if isinstance(value, dict):
        for key, item in value.items():
            found = _first_control(key, f"{where}[key]") or _first_control(item, f"{where}[{shown(key)}]")
            if found:
                return found
    return None


def is_address(value: str) -> bool:
    """Whether ``value`` is an IP address (without an IPv6 zone) or a DNS hostname: RFC 1123
    labels, the last one not all digits (``10.0.0.256`` is a mistyped address, not a name)."""
    if is_ip_address(value):
        return True
    labels = value.split(".")
    return len(value) <= 253 and all(_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def is_ip_address(value: str) -> bool:
    """Whether ``value`` is an IP address (v4 or v6, without a zone), not a DNS hostname."""
    if "%" in value:  # an IPv6 zone (fe80::1%eth0) is free text to ipaddress
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def check_address(value: str) -> str:
    """``value`` when :func:`is_address`, else ``ValueError`` (a pydantic validator)."""
    if not is_address(value):
        raise ValueError(f"must be an IP address or a DNS hostname, found {shown(value)}")
    return value
