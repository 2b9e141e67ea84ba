"""The controller's Hub token, found where huggingface_hub finds it, so that the hosts get the token
``kimi-deploy lock`` (huggingface_hub itself) used.

huggingface_hub 2.4.0 (``utils/_auth.py`` ``get_token``; ``constants.py``): ``HF_TOKEN``, else the legacy
``HUGGING_FACE_HUB_TOKEN``, else the file ``HF_TOKEN_PATH``, which defaults to ``$HF_HOME/token``, whose
``HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``, whose ``XDG_CACHE_HOME`` defaults to ``~/.cache``;
``~`` and ``$VARS`` in those paths expanded. Blank values count as unset, surrounding whitespace is dropped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

_VAR = re.compile(r"\$(\w+|\{[^}]*\})")


def _expand(path: str, environ: Mapping[str, str]) -> str:
    """``os.path.expanduser`` then ``os.path.expandvars``, against ``environ``."""
    home = environ.get("HOME") or str(Path.home())
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]

    def var(match: re.Match[str]) -> str:
        name = match.group(1).strip("{}")
        return environ.get(name, match.group(0))

    return _VAR.sub(var, path)


def token_path(environ: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps its token under ``environ``."""
    explicit = environ.get("HF_TOKEN_PATH")
    if explicit:
        return Path(_expand(explicit, environ))
    cache = environ.get("XDG_CACHE_HOME") or _expand("~/.cache", environ)
    hf_home = environ.get("HF_HOME") or os.path.join(cache, "huggingface")
    return Path(_expand(hf_home, environ)) / "token"


def controller_token(environ: Mapping[str, str]) -> str | None:
    """The token, or None when there is none (public repositories need none)."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = environ.get(name, "").strip()
        if value:
            return value
    try:
        value = token_path(environ).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return value or None
