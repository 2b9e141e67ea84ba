"""Run the communication check alone: ``pyinfra inventories/prod.py deploys/commcheck.py``.

The same check ``deploys/kimi.py`` runs before engines of a multi-host topology (re)start, here
on every such topology whatever runs: every host reaches every port its peers listen on (a serving
engine's port counts, it accepts), and moves data to each peer at the recipe's rate. Changes
nothing; a failure names the pair or host and the cause, on every host of the topology.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory, state

from kimi_deploy.commcheck_plan import check_request, needs_check
from kimi_deploy.deploy_plan import plan_for
from kimi_deploy.errors import ConfigError
from kimi_deploy.run_id import run_id
from operations import commcheck

try:
    deploy = plan_for(inventory, host)
except ConfigError as exc:
    raise PyinfraError(str(exc)) from None

if needs_check(deploy.topology):
    in_run = [p for p in deploy.topology if state.is_host_in_limit(inventory.get_host(p.host))]
    commcheck.passed(name="Communication check", request=check_request(deploy.recipe, deploy.spec, in_run, run_id()))
else:
    logger.info(f"{host.name}: topology {deploy.spec.topology} has no traffic between hosts to check")
