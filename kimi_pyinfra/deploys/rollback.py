"""Undo the latest converge: ``pyinfra inventories/prod.py deploys/rollback.py``.

Every host whose release the latest converge switched goes back to the release it last served
before: its files put back from the release's copies, the ``current`` link switched, its units
restarted in the planner's order across hosts (stores, leaders, workers, routers) and smoke
tested, in the two batches the converge of that release used (the second keeps serving until the
first answers). Nothing is installed or downloaded: the engine release and the weights revision it names
must still be on the host (converges keep the previous ones), or that host stops with one line
saying what is gone. Each host prints the recipe pins to commit so that the next converge keeps
the release it went back to; hosts the latest converge did not change are left alone.
"""

from __future__ import annotations

from typing import Any

from pyinfra import logger
from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.host import Host
from pyinfra.context import host, inventory, state

from kimi_deploy.converge.plan import needs_start
from kimi_deploy.converge.rollback import Rollback, RollbackError, latest_run, pins_line, plan_rollback
from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.probe_types import UnitState
from kimi_deploy.hostside.requests import SmokePlan
from kimi_deploy.plan.start_batches import BATCHES, first_batch, unit_batch
from kimi_deploy.recipe import Paths
from kimi_pyinfra import stop_signals
from kimi_pyinfra.host_plan import plan_for
from kimi_pyinfra.inventory_probe import probe_all, probe_of
from kimi_pyinfra.operations import preflight, releases
from kimi_pyinfra.run_context import in_run, run_context
from kimi_pyinfra.start_order import SUFFIXES, start_batch


@in_run
@pyinfra_deploy("rollback")
def deploy_rollback() -> None:
    """Undo the latest converge: ``pyinfra inventories/prod.py deploys/rollback.py``."""

    def paths_of(h: Host) -> Paths:
        """Where the host keeps releases: from its recipe if it loads (a rollback must work even when
        the recipe now names something broken), else the defaults."""
        try:
            return plan_for(inventory, h).recipe.paths
        except ConfigError:
            return Paths()

    def probe_request(h: Host) -> dict[str, Any]:
        paths = paths_of(h)
        return {"request": {"user": paths.user, "link": paths.current, "releases": True}}

    # Ctrl-C and SIGTERM stop the run once the step under way ends on every host (kimi_pyinfra.stop_signals).
    stop_signals.install(state)
    found = probe_of(state, host, probe_request)
    probed = probe_all(state, probe_request)
    run = latest_run(r["releases"]["entries"] for r in probed.values() if not isinstance(r, BaseException))
    try:
        plan = plan_rollback(
            host.name, found["current"], found["releases"]["entries"], found["releases"]["records"], run
        )
        failures: list[str] = []
    except RollbackError as exc:
        plan, failures = Rollback(None, {}), [str(exc)]

    preflight.passed(name="Rollback target", failures=failures, what="rollback")
    if plan.target is None and not failures:
        logger.info(plan.why)
    elif plan.target is not None:
        logger.info(pins_line(host.name, plan))

    # The batch this host's units restart in: the one the converge of that release used (an older
    # record has none: the first). A batch keeps serving what it serves until the ones before it
    # answer their smoke tests, and goes only if no host failed.
    record = plan.record
    my_batch = int(record.get("batch") or 0) if plan.target is not None else 0
    stages: dict[str, int] = record.get("stages", {})
    place_batch = first_batch(stages.values(), my_batch)

    def batch_of_unit(name: str) -> int:
        """The batch the unit ``name`` restarts in (a unit of a record without stages: its host's)."""
        return unit_batch(stages[name], my_batch) if name in stages else my_batch

    def nothing_failed() -> bool:
        return not state.failed_hosts

    def put_back(batch: int, go: Any = None) -> None:
        """This host's files and ``current`` link back to the target release, in its own batch."""
        if plan.target is None or batch != place_batch:
            return
        suffix = SUFFIXES[batch]
        releases.restored(
            name=f"Files of the release{suffix}", release_dir=plan.target, files=record.get("files", []), _if=go
        )
        releases.current(
            name=f"Current release{suffix}",
            link=paths_of(host).current,
            release_dir=plan.target,
            record=record,
            links={},
            found=found["current"],
            run=run_context().run_id,
            outcome="rolled-back",
            _if=go,
        )

    def my_units(batch: int) -> list[tuple[int, str, str, UnitState | None]]:
        if plan.target is None:
            return []
        return [
            (stage, name, record["units"][name], found["units"].get(name))
            for name, stage in sorted(stages.items())
            if batch_of_unit(name) == batch
        ]

    def my_checks(batch: int) -> list[SmokePlan]:
        if plan.target is None:
            return []
        return [
            {
                "unit": name,
                "url": smoke["url"],
                "request": smoke["request"],
                "restarted": needs_start(record["units"][name], found["units"].get(name)),
                "restarts": 0,
                "only": None,
            }
            for name, smoke in sorted(record.get("smoke", {}).items())
            if batch_of_unit(name) == batch
        ]

    # Every host takes every step of the start order, whether it goes back or not (see start_order).
    for batch in host.loop(range(BATCHES)):  # type: ignore[no-untyped-call]
        go = nothing_failed if batch else None
        put_back(batch, go)
        start_batch(batch, my_units(batch), my_checks(batch), go)
    if plan.target is not None:
        releases.serving(name="Release recorded serving", release_dir=plan.target, last=None, run=run_context().run_id)
