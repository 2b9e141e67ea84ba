"""Each host's part of the plan and its converge, computed once per run for every host.

A deploy file runs once per host, and some decisions span hosts (the parallel probe needs every
host's request, the weights fan-out every host's target): both read these, computed once.
"""

from __future__ import annotations

from typing import Any

from kimi_deploy.converge import Converge, plan_converge
from kimi_deploy.deploy_plan import DeployPlan, plan_for

# One entry for the current run: the pyinfra inventory (held so its id is not reused), and each
# host's plan and converge by name.
_last: tuple[Any, dict[str, tuple[DeployPlan, Converge]]] | None = None


def todo_for(inventory: Any, host: Any) -> tuple[DeployPlan, Converge]:
    """``host``'s plan and converge (pyinfra objects in); ``ConfigError`` as ``plan_for`` raises it."""
    global _last  # noqa: PLW0603 - a one-entry cache for the current run
    if _last is None or _last[0] is not inventory:
        _last = (inventory, {})
    done = _last[1]
    if host.name not in done:
        deploy = plan_for(inventory, host)
        done[host.name] = (deploy, plan_converge(deploy))
    return done[host.name]
