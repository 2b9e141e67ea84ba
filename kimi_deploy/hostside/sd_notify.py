"""Tell systemd a service's state (``sd_notify(3)``): a host program run as a ``Type=notify``
transient service says ``READY=1`` once it listens, so that the step starting it returns only
then."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> None:
    """Send ``message`` (``READY=1``) to the service manager; nothing outside a notify service."""
    where = os.environ.get("NOTIFY_SOCKET")
    if not where:
        return
    address = "\0" + where[1:] if where.startswith("@") else where
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(message.encode(), address)
