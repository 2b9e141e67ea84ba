"""Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``.

The plan is computed for the whole inventory before any change, exactly as
``kimi-deploy plan RECIPE INVENTORY`` shows it; a bad recipe or inventory stops the run with
one line naming the file, the field and the rule. Then, per host, each step a gate: drivers
(deploys/drivers.py), engine (and tool) releases, weights at the pinned revision verified against
the lock, the communication check of multi-host topologies, rendered units, start or restart of
what changed (in order across hosts, in two batches), and the smoke test of what was
(re)started; then the weights revisions that are neither served nor the rollback copy go. One probe round-trip
per host, all hosts probed at once, reads everything these steps decide on. Weights are fetched
from the Hub once and fanned out between hosts when the recipe says ``weights.fan_out``.
"""

from __future__ import annotations

from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory, state

from kimi_deploy.converge.cold_start import engine_starts_asked
from kimi_deploy.converge.drift import drift
from kimi_deploy.converge.file_diff import file_diffs
from kimi_deploy.converge.host_files import host_files
from kimi_deploy.converge.plan import Converge, transfer_key_file
from kimi_deploy.converge.steps import converge_steps
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.start_batches import ROUTERS
from kimi_deploy.render.watchdog_units import WATCHDOG_UNIT
from kimi_deploy.serving.context_ladder import climb_request
from kimi_deploy.serving.watchdog_report import release_time, watchdog_lines
from kimi_pyinfra import cold_start, dead_peers, fleet_progress, stop_signals
from kimi_pyinfra.converge_run import probe_request, view_of
from kimi_pyinfra.driver_steps import driver_steps, planned
from kimi_pyinfra.host_plan import converge_at, inventory_label, todo_for
from kimi_pyinfra.inventory_probe import probe_of
from kimi_pyinfra.operations import (
    commcheck,
    compile_cache,
    engine,
    packages,
    preflight,
    releases,
    serving,
    units,
    users,
    weights,
)
from kimi_pyinfra.rehearsal import Do, converge_host
from kimi_pyinfra.run_context import in_run, run_context
from kimi_pyinfra.start_order import SUFFIXES, start_batch, unless_failed


@in_run
@pyinfra_deploy("kimi")
def deploy_kimi() -> None:
    """Converge each host to the recipe: ``pyinfra inventories/prod.py deploys/kimi.py``."""
    context = run_context()
    # Ctrl-C and SIGTERM stop the run once the step under way ends on every host (kimi_pyinfra.stop_signals).
    stop_signals.install(state)
    if not context.step_lines:
        # One line per step for the whole run rather than one per host and step (all of it with -v).
        context.step_lines = True
        try:
            where = f"{inventory_label()}: host {host.name}"
            tick_s = fleet_progress.tick_seconds(where, host.data.get(fleet_progress.TICK_DATA))
        except ConfigError as exc:
            raise PyinfraError(str(exc)) from None
        fleet_progress.install(state, tick_s, context.progress_files)
        # How long each phase of each host's converge took: one table at the end (with -v too).
        cold_start.install(state, context.cold_start)
        # A host that drops off the network fails within a bound, not after TCP's own (kimi_pyinfra.dead_peers).
        for h in inventory.get_active_hosts():
            dead_peers.bound(h)
    try:
        deploy, todo = todo_for(inventory, host)
        # The first host's deploy probes every host of the run at once; the others read their result.
        found = probe_of(state, host, probe_request)
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None
    # Every decision, from the plan and what the probes found (kimi_deploy.converge.steps).
    run = view_of(state, host, deploy)
    steps = converge_steps(deploy, todo, found, run)

    spec = deploy.spec
    host.log(
        f"plan: topology {spec.topology}, pool {spec.pool}, {spec.node_role} "
        f"{spec.node_rank}/{spec.nodes}, units {', '.join(u.name for u in spec.units)}"
    )
    if steps.refusal is not None:
        raise PyinfraError(steps.refusal)
    # What changed on the host since the deploy left it, named before it is repaired.
    for line in drift(todo, found, [*todo.files, *todo.release.files, *([steps.hub_token] if steps.hub_token else [])]):
        host.log(f"repairs: {line}")
    if state.config.DIFF:
        # With --diff: every file the converge would change, shown before the run's operations.
        _show_diff(deploy, todo, found, written_key=any(w.key is not None for w in steps.weights))
    # The gap a restart of the only instance of a pool leaves its clients, said before anything changes.
    if steps.only_restart is not None:
        host.log(steps.only_restart)
    # What the host's watchdog found and did between converges (on a host converged before).
    watchdog = deploy.recipe.watchdog
    if watchdog is not None and found["current"] is not None and any(u.name == WATCHDOG_UNIT for u in todo.units):
        engines = [u.name for u in spec.units if u.kind == "engine"]
        since = release_time(found["last_release"])
        for line in watchdog_lines(found["watchdog"], engines, since=since, interval_s=watchdog.interval_s):
            host.log(f"watchdog: {line}")
    # The context ladder this host's engine climbs: the host rendered at each rung it starts at.
    climb = None
    if steps.climb is not None:
        try:
            at = {length: converge_at(inventory, host, length) for length in steps.climb.lengths()}
            climb = climb_request(steps.climb, deploy, todo, at, context.run_id)
        except ConfigError as exc:
            raise PyinfraError(str(exc)) from None
        host.log(f"context ladder: {steps.climb.unit} climbs {', '.join(map(str, steps.climb.rungs))}")

    # Pinned NVIDIA driver (fabric manager, IMEX) or TPU host settings, from what the probe above
    # found (no round-trip of its own).
    drivers, drivers_found, drivers_request = planned(deploy, found.get("drivers"))

    def converge(do: Do) -> None:
        """Every step of this host's converge, in order (``kimi_pyinfra.rehearsal``: a host on which
        none would change anything adds no operation)."""
        do(preflight.passed, name="Preflight", failures=steps.preflight_failures)

        # Drivers before any engine, its operations named as deploys/drivers.py names them.
        with host.deploy("drivers", None, None, in_deploy=False):
            driver_steps(do, deploy, drivers, drivers_found, drivers_request)

        do(users.system_user, name="Engine user", user=todo.user, exists=found["user"])
        if todo.packages:
            do(
                packages.debian,
                name="Debian packages",
                packages=todo.packages,
                masked=todo.masked,
                installed=found.get("packages") or {},
            )

        for step in steps.releases:
            r = step.release
            do(
                engine.venv,
                name="Releases (engine, host tools)",
                path=r.path,
                package=r.package,
                version=r.version,
                requirements=r.requirements,
                index_url=todo.index_url,
                current=step.current,
                lock=step.lock,
                platform=steps.platform,
                uv=steps.uv,
                uv_dir=steps.uv_dir,
                without=r.without,
                committed=r.committed,
            )

        if steps.hub_token is not None:
            do(
                units.rendered,
                name="Hub token",
                files=[steps.hub_token],
                group=todo.user,
                current=found["files"],
                owners=found["owners"],
            )

        # Download once, fan out as a pipeline: every host that serves others listens first; then one
        # step in which the Hub's one host and every host of the chains fetch at once, each relaying
        # what it receives to the next (a local mirror first either way). Each checkpoint the host
        # holds in turn (the model, then its speculative draft), all before any engine (re)starts.
        # the run's transfer key is one file for every checkpoint: written once
        key = next((w.key for w in steps.weights if w.key is not None), None)
        if key is None and todo.weights is not None and any(c.moves for c in steps.compile_caches):
            key = transfer_key_file(todo.weights, run.transfer_key)
        if key is not None:
            do(
                units.rendered,
                name="Weights transfer key",
                files=[key],
                group=todo.user,
                current=found["files"],
                owners=found["owners"],
            )
        for w in host.loop(steps.weights):  # type: ignore[no-untyped-call]
            if w.serves and w.port is not None:
                do(
                    weights.peer_server,
                    name="Weights served to peers",
                    path=w.path,
                    lock=w.lock,
                    bind=deploy.host.address,
                    port=w.port,
                    allow=list(w.serves),
                    key_file=w.key_file,
                    user=todo.user,
                    fetching=w.arriving,
                )
            do(
                weights.revision,
                name="Weights at the pinned revision",
                request=w.sync,
                python=w.python,
                current=w.current,
                full_verify=w.full_verify,
                peers=w.mirror + w.peers,
                peer_key_file=w.key_file if w.peers else None,
                in_order=bool(w.serves),
            )
            if w.serves:
                do(weights.peer_server_stopped, name="Weights no longer served to peers")

        # Each engine's compile cache (kimi_deploy.converge.compile_caches): from the hosts of the run
        # that hold the controller's manifest of its key, through the weights' relay, to those that do
        # not; then the engine's own copy, so that its next start skips the compile.
        for c in host.loop(steps.compile_caches):  # type: ignore[no-untyped-call]
            if c.note:
                host.log(c.note)
            if c.serves and c.manifest is not None and todo.weights is not None:
                do(
                    weights.peer_server,
                    name="Compile cache served to peers",
                    path=c.cache.source,
                    lock=dict(c.manifest),
                    bind=deploy.host.address,
                    port=todo.weights.fan_out_port,
                    allow=list(c.serves),
                    key_file=todo.weights.peer_key_file,
                    user=todo.user,
                )
            do(compile_cache.placed, name="Compile cache placed", request=c.place, unit=c.unit)
            if c.serves:
                do(weights.peer_server_stopped, name="Compile cache no longer served to peers")

        # Before anything of the new release is put in place: a failed check leaves every host of the
        # topology exactly as it was. Then each engine instance's own all-reduce (NCCL over NVLink and
        # the fabric), with the engine release's torch.
        if steps.comm_check:
            commcheck.check_steps(do, steps.comm_check_request, steps.comm_check_why)
        do(
            commcheck.all_reduce_passed,
            name="All-reduce check",
            request=steps.all_reduce_request,
            python=f"{spec.engine_dir}/bin/python",
            user=todo.user,
            why_not=steps.all_reduce_why,
        )

        # What a run that stopped before its smoke tests (re)started, or systemd restarted after a
        # crash, is still starting: it answers its smoke test (waited for, bounded) on every host
        # before any unit of the topology restarts, so that a batch never goes while the instances
        # outside it load; one that fails stops the batches (``unless_failed``), the rest serving.
        do(serving.verified, name="Smoke test of units still starting", checks=steps.waiting)
        # and the engines a drain took out of their router, by a run that stopped before putting them back
        do(
            serving.readmitted,
            name="Router sends to every engine again",
            request=steps.readmit,
            _if=unless_failed(steps.waiting_hosts),
        )

        # Every host that changes takes every step of the start order (the steps are barriers across
        # hosts): the first batch's release is put in place, started and answers its smoke tests on
        # every host before the second batch changes anything anywhere, and the routers come last; a
        # batch goes only if no host of an earlier batch of this topology failed. A host of the second
        # batch keeps its files, its ``current`` link and the engine they describe until the first
        # batch serves.
        for batch in host.loop(steps.batches):  # type: ignore[no-untyped-call]
            go = unless_failed(batch.unless_failed) if batch.unless_failed else None
            suffix = SUFFIXES[batch.batch]
            # The compile cache of a key that a host of an earlier batch compiled and packed in this
            # run, placed before this batch changes anything (the engine still serves meanwhile).
            in_batches = [c for c in steps.compile_caches if c.in_batches] if batch.batch < ROUTERS else []
            for c in host.loop(in_batches if batch.batch else []):  # type: ignore[no-untyped-call]
                do(
                    compile_cache.placed_from_run,
                    name=f"Compile cache placed from this run's pack{suffix}",
                    receives=c.receives if c.batch == batch.batch else None,
                    unit=c.unit,
                    _if=go,
                )
            if batch.place:
                do(
                    units.rendered,
                    name=f"Rendered units and configs{suffix}",
                    files=todo.files,
                    group=todo.user,
                    current=found["files"],
                    owners=found["owners"],
                    _if=go,
                )
                do(
                    releases.current,
                    name=f"Current release{suffix}",
                    link=todo.release.link,
                    release_dir=todo.release.dir,
                    record=todo.release.record,
                    links=todo.release.links,
                    found=found["current"],
                    run=context.run_id,
                    _if=go,
                )
                if found["current"] == todo.release.dir:
                    # the release serving, as the deploy wrote it: its record and copies put back if they drifted
                    do(
                        units.rendered,
                        name=f"Release record{suffix}",
                        files=todo.release.files,
                        group=todo.user,
                        current=found["files"],
                        owners=found["owners"],
                        _if=go,
                    )
                for timer in todo.timers:
                    do(units.timer, name=f"Timers{suffix}", unit=timer, current=found["timers"].get(timer), _if=go)
            start_batch(
                batch.batch,
                batch.units,
                batch.checks,
                go,
                do,
                climb=climb if batch.climbs else None,
                router_view=batch.router_view,
                drain=batch.drain,
            )
            # What the run's chosen host of each key compiled, once its batch serves: packed, and
            # served to the hosts of the key in later batches for the rest of the run.
            for c in host.loop(in_batches):  # type: ignore[no-untyped-call]
                mine = c.batch == batch.batch
                do(
                    compile_cache.packed,
                    name=f"Compile cache packed{suffix}",
                    request=c.pack if mine else None,
                    held=c.manifest,
                    _if=go,
                )
                do(
                    compile_cache.served_packed,
                    name=f"Compile cache served to peers of later batches{suffix}",
                    path=c.cache.source,
                    bind=deploy.host.address,
                    port=todo.weights.fan_out_port if todo.weights is not None else None,
                    allow=list(c.serves_packed) if mine else [],
                    key_file=todo.weights.peer_key_file if todo.weights is not None else "",
                    user=todo.user,
                    _if=go,
                )
        for c in host.loop(steps.compile_caches):  # type: ignore[no-untyped-call]
            if c.serves_packed:
                do(weights.peer_server_stopped, name="Compile cache no longer served to peers of later batches")

        do(
            releases.serving,
            name="Release recorded serving",
            release_dir=todo.release.dir,
            last=found.get("last_release"),
            run=context.run_id,
        )

        # Only now that the planned revision is verified and serving: all but it and the rollback copy go.
        for collect in host.loop(steps.collect):  # type: ignore[no-untyped-call]
            do(
                weights.collected,
                name="Old revisions collected",
                parent=collect.parent,
                keep=collect.keep,
                remove=collect.remove,
            )

    if converge_host(converge) and steps.restarting:
        # Last, where this run (re)started a unit: how long each phase took here, kept with the
        # release serving (``kimi-deploy status``).
        releases.cold_start_recorded(
            name="Cold start recorded",
            current=todo.release.link,
            releases=deploy.recipe.paths.releases,
            run=context.run_id,
            engines=engine_starts_asked(spec),
        )


def _show_diff(deploy: DeployPlan, todo: Converge, found: HostState, *, written_key: bool) -> None:
    """The diff of every file this host's converge would change (``kimi_deploy.converge.file_diff``),
    in one log entry: the hosts' diffs do not interleave."""
    files = host_files(deploy, todo)
    if not written_key:  # the weights transfer key is written while weights move alone
        keys = {c.peer_key_file for c in todo.checkpoints}
        files = [f for f in files if not (f.secret and f.path in keys)]
    lines = file_diffs(host.name, files, found, todo.user, todo.release.dir)
    if not lines:
        host.log("diff: no file changes")
        return
    host.log("\n".join(["diff: the files the converge changes", *(f"    {line}" for line in lines)]))
