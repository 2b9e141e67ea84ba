"""Every file a host's converge writes, from the decisions the converge itself takes them from:
what ``kimi-deploy plan --render`` writes, and what ``deploys/kimi.py`` puts in place.

Pure: from a host's plan and its converge (``plan_converge``), nothing read on the host.
"""

from __future__ import annotations

from kimi_deploy.converge.plan import WITHHELD, Converge, transfer_key_file
from kimi_deploy.host.drivers import driver_files
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.render.files import RenderedFile


def host_files(deploy: DeployPlan, todo: Converge) -> list[RenderedFile]:
    """Every file ``deploy``'s host gets from a converge that goes through (``todo``: its converge),
    in the order the converge writes them, each with the mode and owner it is given:

    - the drivers step's (``kimi_deploy.host.drivers.driver_files``: the NVIDIA module options,
      NVLink subnet manager modules, IMEX nodes and channel unit; a TPU host's kernel settings);
    - the Hub token, where the controller has one, and the weights transfer key, where the recipe
      fans weights out (``weights.fan_out``) and the host holds a checkpoint: a converge writes it
      while weights move through the host (its content is the run's, made when the run starts);
    - the rendered units, environment and config files, the weights scrub's and the watchdog's
      (``todo.files``), secrets among them;
    - the release folder: its record and the copy of every file but secrets a rollback puts back.

    Secret files are marked ``secret``; a file whose content ``plan_converge(plan_only=True)``
    could not know says why in ``withheld``. Left out, as no file's content a plan decides: the
    engine and tool releases (venvs), the weights, what the converge records as it goes (the
    units' applied markers, the release log, the ``current`` link), and the communication
    check's token, which lives on /run while the check runs.
    """
    recipe, spec = deploy.recipe, deploy.spec
    out = list(driver_files(recipe, spec, deploy.topology))
    if todo.weights is not None and todo.weights.token is not None:
        out.append(todo.weights.token)
    fanned = next((c for c in todo.checkpoints if c.fan_out_port is not None), None)
    if fanned is not None:
        out.append(transfer_key_file(fanned, WITHHELD))
    return [*out, *todo.files, *todo.release.files]
