"""An HTTP server that serves from a daemon thread of this process: the shape the cluster's stand-in servers share.

``BackgroundServer`` is bound and listening once constructed; ``start()`` serves it from a daemon thread and
returns it, ``stop()`` ends serving and closes the listening socket (and so does leaving a ``with`` block).
``BackgroundHandler`` is the request handler to pair with it: keep-alive, and silent unless the server is
``verbose``. ``parse_command_line`` and ``run_until_signalled`` make up a stand-in's ``main``: the options
every one takes, and serving until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socketserver import BaseRequestHandler
from types import FrameType
from typing import Any, Self


class BackgroundServer(ThreadingHTTPServer):
    """A threading HTTP server that ``start()`` serves in the background; the socket is bound by the constructor.

    Callers may rely on: each connection is handled in a daemon thread (an open keep-alive connection never
    holds the process up); ``start()`` returns the server itself, serving; ``stop()`` may be called more than
    once and on a server never started; ``url`` is where clients reach it. ``verbose`` (off unless set) is what
    ``BackgroundHandler`` consults before logging a request.
    """

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 resets connections when a whole cluster calls at once.
    request_queue_size = 128
    # How often serve_forever looks for a shutdown request: the most stop() waits for it.
    poll_interval: float = 0.2

    def __init__(self, address: tuple[str, int], handler: Callable[[Any, Any, Self], BaseRequestHandler]) -> None:
        self.verbose = False
        self._thread: threading.Thread | None = None
        super().__init__(address, handler)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the bound address, no trailing slash; a server whose clients start below a
        path, or that needs another spelling of the address, overrides it."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        """Serve from a daemon thread (it never holds the process up) and return this server."""
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": self.poll_interval}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket. Connections already open are left to their (daemon)
        threads. Idempotent; on a server never started it only closes the socket."""
        if self._thread is not None:
            # shutdown() waits for serve_forever to notice, and would wait forever if it never ran.
            self.shutdown()
            # serve_forever has returned by now, so the thread is only unwinding: the join is short.
            self._thread.join()
            self._thread = None
        self.server_close()

    # socketserver's __exit__ only closes the socket and would leave the serving thread behind.
    def __exit__(self, *exc: object) -> None:
        self.stop()


class BackgroundHandler(BaseHTTPRequestHandler):
    """A request handler for a ``BackgroundServer``: HTTP/1.1 keep-alive, and one stderr line per request
    (``CLIENT - MESSAGE``) only while ``server.verbose`` is set. Mix it in before another handler class
    (``class H(BackgroundHandler, SimpleHTTPRequestHandler)``) to give that one the same behaviour."""

    server: BackgroundServer
    # Keep-alive: pip and apt fetch many files from one server, and reuse the connection when allowed.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet by default: a cluster's worth of requests would drown the service logs.
        if self.server.verbose:
            sys.stderr.write(f"{self.client_address[0]} - {format % args}\n")


def parse_command_line(
    module: str, description: str, port: int, root_help: str, argv: list[str] | None
) -> argparse.Namespace:
    """Parse ``python -m MODULE --bind ADDR --port PORT --root DIR [--verbose]``, the command line the cluster
    starts every stand-in server with. The result has ``bind`` (default 127.0.0.1), ``port`` (default ``port``),
    ``root`` (a Path, required) and ``verbose``; bad arguments exit with argparse's usage message."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (loopback or the cluster bridge)")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--root", type=Path, required=True, help=root_help)
    parser.add_argument("--verbose", action="store_true", help="log every request on stderr")
    return parser.parse_args(argv)


def run_until_signalled(server: BackgroundServer, serving: str) -> None:
    """Start ``server``, print ``serving SERVING on URL/`` to stdout (flushed, once it accepts connections), and
    serve until SIGTERM or SIGINT; then stop it and return. Installs handlers for both signals."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    print(f"serving {serving} on {server.url}/", flush=True)
    # A bounded wait returns to the interpreter regularly, so the signal handlers run promptly.
    while not stop.wait(0.5):
        pass
    server.stop()
