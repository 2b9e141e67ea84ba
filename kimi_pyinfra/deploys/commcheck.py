"""Run the communication check alone: ``pyinfra inventories/prod.py deploys/commcheck.py``.

The same checks ``deploys/kimi.py`` runs before engines of a multi-host topology (re)start, here
on every such topology whatever runs: every host reaches every port its peers listen on (a serving
engine's port counts, it accepts), and moves data to each peer at the recipe's rate; then, where
the recipe sets ``comm_check.all_reduce``, each engine instance's all-reduce with the installed
engine release's torch (running engines keep their GPU memory: the check needs room beside them).
Changes nothing; a failure names the pair or host and the cause, on every host it concerns.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory, state

from kimi_deploy.errors import ConfigError
from kimi_deploy.serving.allreduce import all_reduce_request, why_not
from kimi_deploy.serving.commcheck import check_request, needs_check
from kimi_pyinfra.host_plan import plan_for
from kimi_pyinfra.operations import commcheck
from kimi_pyinfra.rehearsal import perform
from kimi_pyinfra.run_context import in_run, run_context


@in_run
@pyinfra_deploy("commcheck")
def deploy_commcheck() -> None:
    """Run the communication check alone: ``pyinfra inventories/prod.py deploys/commcheck.py``."""
    try:
        deploy = plan_for(inventory, host)
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None

    run_id = run_context().run_id
    in_run = [p for p in deploy.topology if state.is_host_in_limit(inventory.get_host(p.host))]
    if needs_check(deploy.topology):
        commcheck.check_steps(perform, check_request(deploy.recipe, deploy.spec, in_run, run_id))
    else:
        logger.info(f"{host.name}: topology {deploy.spec.topology} has no traffic between hosts to check")
    why = why_not(deploy.recipe, deploy.spec, in_run)
    commcheck.all_reduce_passed(
        name="All-reduce check",
        request=None if why else all_reduce_request(deploy.recipe, deploy.spec, in_run, run_id),
        python=f"{deploy.spec.engine_dir}/bin/python",
        user=deploy.recipe.paths.user,
        why_not=why or "",
    )
