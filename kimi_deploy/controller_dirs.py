"""The controller's own folders, per the XDG base directory specification."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def controller_cache(environ: Mapping[str, str]) -> Path:
    """The controller's cache folder (``environ``: the controller's environment):
    ``$XDG_CACHE_HOME/kimi-deploy``, else ``~/.cache/kimi-deploy``."""
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "kimi-deploy"


def controller_state(environ: Mapping[str, str]) -> Path:
    """The controller's state folder: ``$XDG_STATE_HOME/kimi-deploy``, else
    ``~/.local/state/kimi-deploy``."""
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "kimi-deploy"
