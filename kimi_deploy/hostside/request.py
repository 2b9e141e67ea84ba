"""A host program's request: the controller's JSON object, compressed and base64-encoded into one
argv word (``kimi_deploy.host.command.pack``). Every host program reads it here.

Stdlib only; no typing import (the host probe reads its request with this module, and typing
costs every probe several ms).
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import zlib

TYPE_CHECKING = False  # for type checkers only
if TYPE_CHECKING:
    from typing import Any

# The largest request the controller sends (a weights sync's file list for a revision of ~100
# shards) is some hundred KiB; past this, what came is not a request.
MAX_BYTES = 64 * 2**20


class BadRequest(ValueError):
    """argv holds no request: missing, not base64, not zlib, too large, not a JSON object."""


def read_request(argv: list[str] | None = None) -> Any:
    """The request in ``argv[1]`` (``sys.argv`` by default), a JSON object: of the type the program
    names for it (``kimi_deploy.hostside.requests``), which the controller built it as."""
    args = sys.argv if argv is None else argv
    if len(args) < 2:
        raise BadRequest("no request: expected one argument")
    try:
        inflater = zlib.decompressobj()
        text = inflater.decompress(base64.b64decode(args[1], validate=True), MAX_BYTES)
        if inflater.unconsumed_tail:
            raise BadRequest(f"the request is larger than {MAX_BYTES} bytes")
        data = json.loads(text)
    except (binascii.Error, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"cannot decode the request: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request is a JSON {type(data).__name__}, not an object")
    return data
