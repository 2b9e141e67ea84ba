"""Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``.

The plan is computed for the whole inventory before any change, exactly as
``kimi-deploy plan RECIPE INVENTORY`` shows it; a bad recipe or inventory stops the run with
one line naming the file, the field and the rule.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from kimi_deploy.deploy_plan import plan_for
from kimi_deploy.errors import ConfigError

try:
    recipe, spec = plan_for(inventory, host)
except ConfigError as exc:
    raise PyinfraError(str(exc)) from None

logger.info(
    f"{host.name}: topology {spec.topology}, pool {spec.pool}, {spec.node_role} "
    f"{spec.node_rank}/{spec.nodes}, units {', '.join(u.name for u in spec.units)}"
)
