"""Values written into an nginx configuration: double-quoted, from a set of characters that nginx
reads back as they are.

nginx's parser ends a word at whitespace, ``;``, ``{`` and ``}``, reads ``\\`` escapes and quotes
inside a quoted string and expands ``$name`` variables in most directives' values, with no escape
for ``$`` ("Core functionality", nginx.org/en/docs/ngx_core_module.html, and the parser
src/core/ngx_conf_file.c). So a value holds only letters, digits, spaces and ``._~:/@+=,[]-`` and
goes inside double quotes; anything else is refused, never escaped. That covers the recipe's names,
addresses, URLs' hosts and paths, and RFC 6750 bearer tokens.
"""

from __future__ import annotations

import re

_ALLOWED = re.compile(r"[A-Za-z0-9 ._~:/@+=,\[\]-]*")
RULE = "letters, digits, spaces and ._~:/@+=,[]- only"


def nginx_string(value: str) -> str:
    """``value`` as one quoted nginx word; ``ValueError`` naming the first character's position
    (never the value: it may be a key) when it holds one outside the allowed set."""
    match = _ALLOWED.match(value)
    assert match is not None
    if match.end() != len(value):
        raise ValueError(f"character {match.end() + 1} of {len(value)} is not allowed in an nginx value ({RULE})")
    return f'"{value}"'
