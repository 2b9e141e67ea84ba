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

from collections.abc import Callable
from typing import Any

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.host import Host
from pyinfra.context import host, inventory, state

from facts.inventory_probe import active_hosts, probe_all, probe_of
from kimi_deploy.allreduce_plan import all_reduce_request, members
from kimi_deploy.allreduce_plan import label as instance_label
from kimi_deploy.allreduce_plan import why_not as all_reduce_why_not
from kimi_deploy.commcheck_plan import check_request, needs_check
from kimi_deploy.converge import converge_request, port_conflicts, preflight_needs, sync_request, unit_state
from kimi_deploy.driver_plan import probe_request as drivers_request
from kimi_deploy.errors import ConfigError
from kimi_deploy.host_paths import tool_dir
from kimi_deploy.preflight import check as preflight_check
from kimi_deploy.render import RenderedFile
from kimi_deploy.start_batches import BATCHES, batch_of, first_batch_of, unit_batch
from kimi_deploy.venv_lock import lock_source
from kimi_deploy.weights_fanout import WeightsHost, plan_fan_out
from kimi_deploy.weights_gc import collectable
from kimi_pyinfra.host_plan import todo_for
from kimi_pyinfra.run_context import run_context
from kimi_pyinfra.shipped import include_deploy
from operations import commcheck, engine, packages, preflight, releases, units, users, weights
from operations.start_order import SUFFIXES, start_batch


def probe_request(h: Host) -> dict[str, Any]:
    """What ``h``'s probe reads: its converge's state, its hardware and its drivers."""
    plan, work = todo_for(inventory, h)
    return {
        "request": converge_request(work),
        "hardware": {"weights_dir": plan.recipe.paths.models},
        "drivers": drivers_request(plan.recipe, plan.spec),
    }


def weights_host(h: Host, probed: Any) -> WeightsHost:
    plan, work = todo_for(inventory, h)
    target = work.weights
    if target is None or isinstance(probed, BaseException):
        return WeightsHost(h.name, plan.host.address, None, None, None)
    wants = (target.repo, target.revision, target.path)
    return WeightsHost(h.name, plan.host.address, wants, target.fan_out_port, probed["weights"], target.full_verify)


context = run_context()
try:
    deploy, todo = todo_for(inventory, host)
    # The first host's deploy probes every host of the run at once; the others read their result.
    found = probe_of(state, host, probe_request)
except ConfigError as exc:
    raise PyinfraError(str(exc)) from None

spec = deploy.spec
logger.info(
    f"{host.name}: topology {spec.topology}, pool {spec.pool}, {spec.node_role} "
    f"{spec.node_rank}/{spec.nodes}, units {', '.join(u.name for u in spec.units)}"
)

restarting = frozenset(u.name for u in todo.units if units.needs_start(u.release, unit_state(u, found)))
conflicts = port_conflicts(todo, found["listeners"], restarting)
if conflicts:
    # Before any change on any host: starting would fail, and the running release must stay.
    raise PyinfraError(f"{host.name}: {conflicts[0]}")

preflight.passed(name="Preflight", failures=preflight_check(preflight_needs(todo, deploy, found), found["hardware"]))

# Pinned NVIDIA driver (fabric manager, IMEX) or TPU host settings, before any engine; it reads
# what the probe above found, no round-trip of its own.
if found.get("drivers") is not None:
    context.drivers[host.name] = found["drivers"]
include_deploy("drivers.py")

users.system_user(name="Engine user", user=todo.user, exists=found["user"])
if todo.packages:
    packages.debian(
        name="Debian packages", packages=todo.packages, masked=todo.masked, installed=found.get("packages") or {}
    )

# Every host installing a release installs the same lock: its own (a damaged copy is rebuilt from
# it), that of a host holding the release, or the one the first installer resolves before the rest.
probed = probe_all(state, probe_request)
uv = deploy.recipe.tools.uv
uv_dir = tool_dir(deploy.recipe, "uv", uv)
in_run = [h.name for h in active_hosts(state)]
lock_sources = {r.path: lock_source(host.name, r.path, r.requirements, probed, in_run) for r in todo.venvs}
for release in todo.venvs:
    engine.lock_resolved(
        name="Release locks resolved",
        path=release.path,
        requirements=release.requirements,
        index_url=todo.index_url,
        source=lock_sources[release.path],
        uv=uv,
        uv_dir=uv_dir,
        without=release.without,
    )
for release in todo.venvs:
    engine.venv(
        name="Releases (engine, host tools)",
        path=release.path,
        package=release.package,
        version=release.version,
        requirements=release.requirements,
        index_url=todo.index_url,
        current=found["venvs"].get(release.path),
        lock=lock_sources[release.path],
        uv=uv,
        uv_dir=uv_dir,
        without=release.without,
    )

if todo.weights is not None and todo.weights.token is not None:
    units.rendered(name="Hub token", files=[todo.weights.token], group=todo.user, current=found["files"])

# Download once, fan out: who fetches from the Hub, who from peers, and who serves them.
fan_out = plan_fan_out([weights_host(h, probed[h.name]) for h in active_hosts(state) if h.name in probed])[host.name]
target = todo.weights
sync: dict[str, Any] = {}
if target is not None:
    sync = {"request": sync_request(target), "python": target.python, "current": found["weights"]}
mirror = [{"host": "mirror", "path": target.mirror}] if target is not None and target.mirror else []
if target is not None and fan_out.sync != "peers":
    weights.revision(name="Weights at the pinned revision", full_verify=target.full_verify, peers=mirror, **sync)
if target is not None and (fan_out.serves or fan_out.sync == "peers"):
    key = RenderedFile(target.peer_key_file, context.transfer_key + "\n", 0o440, "root", secret=True)
    units.rendered(name="Weights transfer key", files=[key], group=todo.user, current=found["files"])
if target is not None and target.fan_out_port is not None and fan_out.serves:
    weights.peer_server(
        name="Weights served to peers",
        path=target.path,
        lock=target.lock,
        bind=deploy.host.address,
        port=target.fan_out_port,
        allow=list(fan_out.serves),
        key_file=target.peer_key_file,
        user=todo.user,
    )
if target is not None and target.fan_out_port is not None and fan_out.sync == "peers":
    weights.revision(
        name="Weights from peers",
        peers=mirror + [{"host": p.host, "url": f"http://{p.address}:{target.fan_out_port}"} for p in fan_out.peers],
        peer_key_file=target.peer_key_file,
        **sync,
    )
if target is not None and fan_out.serves:
    weights.peer_server_stopped(name="Weights no longer served to peers")


# The hosts of this host's topology that this run covers (whether or not they answered).
in_topology = [
    p for p in deploy.topology if (h := inventory.get_host(p.host, None)) is not None and state.is_host_in_limit(h)
]


def restarts_in_topology() -> list[str]:
    """Hosts of this topology in the run where some unit will (re)start, or that could not be
    probed (down, unreachable): the communication check is needed then."""
    out = []
    for peer in in_topology:
        result = probed.get(peer.host)
        if result is None or isinstance(result, BaseException):
            out.append(peer.host)
            continue
        work = todo_for(inventory, inventory.get_host(peer.host))[1]
        if any(units.needs_start(u.release, unit_state(u, result)) for u in work.units):
            out.append(peer.host)
    return out


# Before anything of the new release is put in place: a failed check leaves every host of the
# topology exactly as it was (files, current release, running engines).
restarting_hosts = restarts_in_topology()
if needs_check(deploy.topology):
    commcheck.passed(
        name="Communication check",
        request=check_request(deploy.recipe, spec, in_topology, context.run_id) if restarting_hosts else None,
        why_not=f"no engine of topology {spec.topology} starts or restarts",
    )

# Then each engine instance's own communicator (NCCL over NVLink and the fabric), with the engine
# release's torch, when an engine of the instance will (re)start.
all_reduce_why = all_reduce_why_not(deploy.recipe, spec, in_topology)
if all_reduce_why is None and not any(h.host in restarting_hosts for h in members(spec, in_topology)):
    all_reduce_why = f"no engine of instance {instance_label(spec)} starts or restarts"
commcheck.all_reduce_passed(
    name="All-reduce check",
    request=None if all_reduce_why else all_reduce_request(deploy.recipe, spec, in_topology, context.run_id),
    python=f"{spec.engine_dir}/bin/python",
    user=todo.user,
    why_not=all_reduce_why or "",
)

my_batch = batch_of(spec, deploy.topology)
place_batch = first_batch_of(spec, deploy.topology)


def earlier_batches_ok(batch: int) -> Callable[[], bool]:
    """At execute time: no host of this topology that (re)started units in a batch before
    ``batch`` failed (else this batch keeps serving the release it runs)."""
    earlier = [p.host for p in deploy.topology if first_batch_of(p, deploy.topology) < batch]
    return lambda: not any(inventory.get_host(name, None) in state.failed_hosts for name in earlier)


def my_units(batch: int) -> list[tuple[int, str, str, dict[str, Any] | None]]:
    return [(u.stage, u.name, u.release, unit_state(u, found)) for u in todo.units
            if unit_batch(u.stage, my_batch) == batch]  # fmt: skip


def my_checks(batch: int) -> list[dict[str, Any]]:
    checks = []
    for u in todo.units:
        if u.smoke is None or unit_batch(u.stage, my_batch) != batch:
            continue
        state = unit_state(u, found)
        starts = units.needs_start(u.release, state)
        seen = state or {}
        # systemd restarted it on its own (it crashed) since a smoke test last found it serving:
        # this converge checks it again, without a restart
        restarts = 0 if starts else int(seen.get("restarts") or 0)
        crashed = restarts > int(seen.get("restarts_verified") or 0)
        checks.append({
            "unit": u.name,
            "url": u.smoke.url,
            "request": u.smoke.request,
            "restarted": starts or crashed,
            "restarts": restarts,
        })  # fmt: skip
    return checks


def put_in_place(batch: int, go: Any = None) -> None:
    """This host's new release in place, in its own batch: its rendered files, its timers and the
    ``current`` link. A host of the second batch keeps its files and link as they are, and the
    engine they describe, until the first batch serves."""
    if batch != place_batch:
        return
    suffix = SUFFIXES[batch]
    units.rendered(
        name=f"Rendered units and configs{suffix}", files=todo.files, group=todo.user, current=found["files"], _if=go
    )
    releases.current(
        name=f"Current release{suffix}",
        link=todo.release.link,
        release_dir=todo.release.dir,
        record=todo.release.record,
        links=todo.release.links,
        found=found["current"],
        run=context.run_id,
        _if=go,
    )
    for timer in todo.timers:
        units.timer(name=f"Timers{suffix}", unit=timer, current=found["timers"].get(timer), _if=go)


# Every host takes every step of the start order (the steps are barriers across hosts): the first
# batch's release is put in place, started and answers its smoke tests on every host before the
# second batch changes anything anywhere, and the routers come last; a batch goes only if no host
# of an earlier batch of this topology failed.
for batch in host.loop(range(BATCHES)):  # type: ignore[no-untyped-call]
    go = earlier_batches_ok(batch) if batch else None
    put_in_place(batch, go)
    start_batch(batch, my_units(batch), my_checks(batch), go)

releases.serving(
    name="Release recorded serving", release_dir=todo.release.dir, last=found.get("last_release"), run=context.run_id
)

# Only now that the planned revision is verified and serving: all but it and the rollback copy go.
if target is not None and found.get("revisions") is not None:
    revisions = found["revisions"]
    drop = collectable(revisions["present"], revisions["history"], target.revision)
    weights.collected(
        name="Old revisions collected",
        parent=target.path.rsplit("/", 1)[0],
        keep=[r for r in revisions["present"] if r not in drop] or [target.revision],
        remove=drop,
    )
