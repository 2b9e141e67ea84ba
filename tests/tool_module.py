"""A script of tools/ imported as a module, the way tests read its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_tool(path: Path | str) -> ModuleType:
    """The module of the script at ``path``, registered under its file name's stem."""
    name = Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclasses look their module up while being created.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
