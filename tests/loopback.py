"""A test's HTTP server on loopback, served from a thread for the length of a fixture."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import TypeVar

Server = TypeVar("Server", bound=ThreadingHTTPServer)


def serving(server: Server) -> Iterator[Server]:
    """Serve ``server`` from a daemon thread, yield it, then shut it down and close it."""
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
