"""The fake HTTP servers' one way of answering JSON."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


def send_json(handler: BaseHTTPRequestHandler, doc: object, status: int = 200) -> None:
    """Answer ``doc`` as ``application/json`` with its length."""
    body = json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
