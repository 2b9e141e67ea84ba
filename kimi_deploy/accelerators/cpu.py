"""The host's own CPUs: an engine's CPU build (vLLM's) serving from host RAM, as the local demo
does. A rank is a share of the host's cores and RAM; ``accelerators.model``, when given, is a part
of the CPU's model name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kimi_deploy.accelerators.interface import GIB, AcceleratorKind, matches_words, size_text
from kimi_deploy.plan.servespec import CPU_ANY

if TYPE_CHECKING:
    from kimi_deploy.host.profile_types import HostProfile
    from kimi_deploy.plan.servespec import HostPlan

NAME = "cpu"


def _preflight(kind: AcceleratorKind, spec: HostPlan, profile: HostProfile) -> str | None:
    """The CPU model (when the recipe names one) and the RAM the ranks take, whatever
    accelerators the host also has."""
    cpu = profile["cpu"]
    ram = profile["memory"]["total_bytes"] or 0
    need = spec.accelerators * spec.accelerator_memory_gib * GIB
    model = spec.accelerator_model if spec.accelerator_model != CPU_ANY else None
    each = f"{spec.accelerator_memory_gib} GiB of RAM"
    want = f"pool {spec.pool} needs {spec.accelerators} x {model or 'CPU'} rank with {each}"
    found = f"{cpu['count'] or '?'} x {cpu['model'] or 'unknown CPU'} with {size_text(ram)} of RAM"
    if (model is not None and not matches_words(cpu["model"] or "", model)) or ram < need:
        return f"accelerators: {want}, found {found}"
    return None


def _price_name(model: str | None) -> str:
    return NAME


KIND = AcceleratorKind(
    name=NAME,
    model_required=False,
    host_cpus=True,
    no_kv_transfer="prefill/decode pools move KV cache with NIXL, which needs GPUs",
    gloo=True,
    priced_by_host=True,
    price_name=_price_name,
    preflight=_preflight,
)
