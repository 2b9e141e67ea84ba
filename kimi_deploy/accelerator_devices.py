"""How many devices an engine's runtime counts on one accelerator of a recipe.

A recipe counts accelerators as a host offers them (``accelerators.per_host``: chips, GPUs); an
engine's parallel sizes count what its runtime sees. They differ where one chip shows as several
devices: a TPU7x (Ironwood) chip has two TensorCores, and JAX shows each as a device of its own
("Each TPU7x chip contains two TensorCores", "access two TPU devices instead of the single logical
core": https://cloud.google.com/tpu/docs/tpu7x, "Dual-chiplet architecture"; sglang-jax's
docs/cookbook/base/tpu-topology-reference.md: v7x, 2 JAX devices per chip, ``--tp-size`` = the
JAX devices of all nodes). Any accelerator not named here is one device.
"""

from __future__ import annotations

from kimi_deploy.recipe import Accelerators

# accelerators.model (as a recipe names it, any case) -> devices the runtime counts on one
DEVICES_PER_ACCELERATOR = {"tpu7x": 2}


def devices_per_accelerator(accelerators: Accelerators) -> int:
    """The runtime's devices on one of ``accelerators``."""
    return DEVICES_PER_ACCELERATOR.get((accelerators.model or "").lower(), 1)
