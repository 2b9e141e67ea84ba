"""Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``.

The plan is computed for the whole inventory before any change, exactly as
``kimi-deploy plan RECIPE INVENTORY`` shows it; a bad recipe or inventory stops the run with
one line naming the file, the field and the rule. Then, per host, each step a gate:
engine (and tool) releases, weights at the pinned revision verified against the lock, rendered
units, start or restart of what changed, and the smoke test of what was (re)started. One probe
round-trip reads everything these steps decide on.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from facts.host_state import KimiHostState
from kimi_deploy.converge import converge_request, plan_converge, port_conflicts, preflight_needs
from kimi_deploy.deploy_plan import plan_for
from kimi_deploy.errors import ConfigError
from kimi_deploy.preflight import check as preflight_check
from operations import engine, preflight, releases, serving, units, users, weights

try:
    deploy = plan_for(inventory, host)
    todo = plan_converge(deploy)
except ConfigError as exc:
    raise PyinfraError(str(exc)) from None

spec = deploy.spec
logger.info(
    f"{host.name}: topology {spec.topology}, pool {spec.pool}, {spec.node_role} "
    f"{spec.node_rank}/{spec.nodes}, units {', '.join(u.name for u in spec.units)}"
)

# One round-trip: the host's hardware and everything the steps below decide on.
hardware_request = {"weights_dir": deploy.recipe.paths.models}
state = host.get_fact(KimiHostState, request=converge_request(todo), hardware=hardware_request)
conflicts = port_conflicts(todo, state["listeners"])
if conflicts:
    # Before any change on any host: starting would fail, and the running release must stay.
    raise PyinfraError(f"{host.name}: {conflicts[0]}")

preflight.passed(name="Preflight", failures=preflight_check(preflight_needs(todo, deploy, state), state["hardware"]))

users.system_user(name="Engine user", user=todo.user, exists=state["user"])

for release in todo.venvs:
    engine.venv(
        name="Releases (engine, host tools)",
        path=release.path,
        package=release.package,
        version=release.version,
        requirements=release.requirements,
        index_url=todo.index_url,
        current=state["venvs"].get(release.path),
    )

if todo.weights is not None and todo.weights.token is not None:
    units.rendered(name="Hub token", files=[todo.weights.token], group=todo.user, current=state["files"])

if todo.weights is not None:
    weights.revision(
        name="Weights at the pinned revision",
        repo=todo.weights.repo,
        revision=todo.weights.revision,
        path=todo.weights.path,
        lock=todo.weights.lock,
        python=todo.weights.python,
        endpoint=todo.weights.endpoint,
        token_file=todo.weights.token.path if todo.weights.token else None,
        current=state["weights"],
        full_verify=todo.weights.full_verify,
    )

units.rendered(name="Rendered units and configs", files=todo.files, group=todo.user, current=state["files"])

releases.current(
    name="Current release",
    link=todo.release.link,
    release_dir=todo.release.dir,
    record=todo.release.record,
    links=todo.release.links,
    found=state["current"],
)

for unit in todo.units:
    current = state["units"].get(unit.name)
    units.running(name="Services", unit=unit.name, release=unit.release, current=current)
    if unit.smoke is not None:
        serving.verified(
            name="Smoke test",
            unit=unit.name,
            url=unit.smoke.url,
            request=unit.smoke.request,
            restarted=units.needs_start(unit.release, current),
        )
