"""A static file server over HTTP, stdlib only: how the cluster serves its apt repository to the hosts.

    python -m localcluster.static_files --bind ADDR --port PORT --root DIR

serves the files under ``DIR/public`` (GET and HEAD, keep-alive, no directory listings); anything
else under ``DIR`` (a signing key, say) is never served. A missing file is a 404, which apt reports
as such; a path leaving ``DIR/public`` (``..``, links pointing out of it) is a 404 too.
"""

from __future__ import annotations

import functools
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

from localcluster.background_server import (
    BackgroundHandler,
    BackgroundServer,
    parse_command_line,
    run_until_signalled,
)

PUBLIC = "public"


class StaticServer(BackgroundServer):
    """The files under ``root/public`` on ``bind:port``; ``start()``/``stop()`` as ``BackgroundServer``."""

    def __init__(self, root: Path, bind: str, port: int) -> None:
        self.public = (root / PUBLIC).resolve()
        super().__init__((bind, port), functools.partial(_Handler, directory=str(self.public)))


class _Handler(BackgroundHandler, SimpleHTTPRequestHandler):
    server: StaticServer

    def send_head(self) -> Any:
        path = Path(self.translate_path(self.path))
        try:
            inside = path.resolve().is_relative_to(self.server.public)
        except OSError:
            inside = False
        if not inside or not path.is_file():
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        return super().send_head()


def serve(root: Path, bind: str = "127.0.0.1", port: int = 0) -> StaticServer:
    """A server for ``root/public`` on ``bind:port`` (0: any free port), already serving; ``.stop()`` ends it."""
    return StaticServer(root, bind, port).start()


def main(argv: list[str] | None = None) -> None:
    args = parse_command_line(
        "localcluster.static_files", __doc__.split("\n")[0], 8767, f"directory whose {PUBLIC}/ is served", argv
    )
    (args.root / PUBLIC).mkdir(parents=True, exist_ok=True)
    server = StaticServer(args.root, args.bind, args.port)
    server.verbose = args.verbose
    run_until_signalled(server, str(server.public))


if __name__ == "__main__":
    main()
