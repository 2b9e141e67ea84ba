"""Optional features and the extra that installs each: a missing one is said in one line.

The default install holds what a converge imports. Two features need more, each an extra of the
distribution: the benchmark's picture (matplotlib, ``kimi-deploy[plot]``) and the fidelity
ledger's reading of nginx's configuration (crossplane, ``kimi-deploy[ledger]``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kimi_deploy.errors import ConfigError

# module -> (extra, feature)
EXTRAS = {
    "matplotlib": ("plot", "the benchmark's picture"),
    "crossplane": ("ledger", "the fidelity ledger"),
}


class MissingExtra(ConfigError):
    """A feature whose extra is not installed: ``MODULE: FEATURE needs it: pip install 'kimi-deploy[EXTRA]'``."""


def need(module: str) -> ModuleType:
    """``module`` imported; ``MissingExtra`` naming the extra that installs it when it is absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        extra, feature = EXTRAS[module]
        raise MissingExtra(
            module, "", f"not installed: {feature} needs it: pip install 'kimi-deploy[{extra}]'"
        ) from None
