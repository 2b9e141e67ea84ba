"""The kinds of accelerator kimi-deploy plans for, found by the name a recipe's
``accelerators.vendor`` uses.

Each kind is one module of this package behind one interface (``interface.AcceleratorKind``); a
new kind is a new module and a line here (docs/add-an-accelerator-kind.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from kimi_deploy.accelerators import cpu, nvidia, tpu
from kimi_deploy.accelerators.interface import AcceleratorKind

# In the order the host profile asks them: the first kind that finds devices names the host's.
KINDS: Mapping[str, AcceleratorKind] = {k.name: k for k in (nvidia.KIND, tpu.KIND, cpu.KIND)}
# A host with no accelerator of the plan's (a topology's router host), and a profile that found none.
NONE = AcceleratorKind(name="none", model_required=False)


def accelerator(name: str) -> AcceleratorKind:
    """The kind a recipe names (the recipe's schema admits only registered names), or ``NONE``'s."""
    return NONE if name == NONE.name else KINDS[name]
