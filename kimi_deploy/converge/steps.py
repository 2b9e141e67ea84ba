"""A host's converge as the steps it takes, decided from its plan and what the probes found.

Pure: ``converge_steps`` reads this host's converge (``converge.plan_converge``), its probe's
answer, and what the run knows of the other hosts (their converges and answers, who fetches
weights from whom, where each release's lock comes from), and returns every step's arguments.
``deploys/kimi.py`` turns the steps into pyinfra operations, in this order: the refusal that stops
the host before any change, preflight, engine user and packages, releases (locks first), the Hub
token, weights (from the Hub, served to and fetched from peers), the communication and all-reduce
checks, then per batch the release put in place, units (re)started and smoke tested, the release
recorded serving, and old weights revisions collected.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from kimi_deploy.converge.compile_caches import CompileCacheStep
from kimi_deploy.converge.plan import (
    Converge,
    UnitTarget,
    needs_start,
    port_conflicts,
    preflight_needs,
    sync_request,
    transfer_key_file,
    unit_state,
)
from kimi_deploy.host.preflight import check as preflight_check
from kimi_deploy.host.profile import parse_profile
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.hostside.probe_types import LadderProof, ReleaseMarker, UnitState, WeightsFound
from kimi_deploy.hostside.requests import (
    AllReduceRequest,
    CommCheckRequest,
    DrainRequest,
    PeerSource,
    RouterViewRequest,
    SmokePlan,
    SyncRequest,
)
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.plan.start_batches import BATCHES, ENGINES, batch_of, first_batch_of, only_instance, unit_batch
from kimi_deploy.releases.host_paths import tool_dir
from kimi_deploy.releases.venv_lock import LockSource, lock_source
from kimi_deploy.releases.venvs import VenvRelease
from kimi_deploy.render.files import RenderedFile
from kimi_deploy.render.router_units import ROUTER_UNIT
from kimi_deploy.render.watchdog_units import WATCHDOG_UNIT
from kimi_deploy.serving.allreduce import all_reduce_request, members
from kimi_deploy.serving.allreduce import label as instance_label
from kimi_deploy.serving.allreduce import why_not as all_reduce_why_not
from kimi_deploy.serving.commcheck import check_request, needs_check
from kimi_deploy.serving.context_ladder import Climb, climb_for
from kimi_deploy.serving.router_drain import drain_request, readmit_request
from kimi_deploy.serving.router_view import view_request
from kimi_deploy.weights.fanout import FanOutPart, WeightsHost, needs_files, plan_fan_out
from kimi_deploy.weights.gc import collectable


@dataclass(frozen=True)
class RunView:
    """What the run knows beyond this host, as the deploy computed it once for every host."""

    run_id: str
    transfer_key: str
    # the hosts of this host's topology that the run covers, whether or not they answered
    in_topology: tuple[HostPlan, ...]
    # each of them (this one too): its converge and its probe's answer (None: it did not answer)
    peers: Mapping[str, tuple[Converge, HostState | None]]
    # this host's part of the weights fan-out of each checkpoint it holds, in its converge's order
    # (``weights_fanout.plan_fan_out`` of each ``weights_hosts`` slot)
    fan_out: tuple[FanOutPart, ...]
    # this host's compile cache steps (``kimi_deploy.converge.compile_caches``), one per engine unit
    compile_caches: tuple[CompileCacheStep, ...] = ()
    # what every host of the topology reads alike of ``peers`` (who restarts, which instances are
    # down, who is still starting, the ladder's proofs), worked out by the first to ask: shared by
    # the views of one topology, so that a run costs each host its own converge, not its topology's
    shared: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class ReleaseStep:
    release: VenvRelease
    lock: LockSource | None
    # the release marker the probe found (None: absent or incomplete)
    current: ReleaseMarker | None


@dataclass(frozen=True)
class WeightsSteps:
    """One checkpoint's steps (the model's, a draft's), taken in turn. This host syncs from
    ``peers`` in turn (none: from the Hub), after a local mirror either way, the Hub last; it may
    serve its files to others, relaying them as they arrive when its own sync brings them
    (``arriving``)."""

    # ``hostside/weights_sync.py``'s request, the python of the Hub client, and what the probe
    # found of the folder
    sync: SyncRequest
    python: str
    current: WeightsFound | None
    mirror: list[PeerSource]
    # every file re-hashed, not only those the verification cache does not vouch for
    full_verify: bool
    # the run's transfer key, written where this host serves or fetches from peers
    key: RenderedFile | None
    key_file: str
    # serving the files to ``serves`` (addresses) on ``port`` (None: no fan-out), and no longer
    # once the run's fetches are done
    serves: tuple[str, ...]
    arriving: bool
    port: int | None
    path: str
    lock: dict[str, list[Any]]
    # from these peers in turn, each ``{"host", "url"}``
    peers: list[PeerSource]


@dataclass(frozen=True)
class CollectStep:
    """Once the planned revision serves: the revision folders under ``parent`` to keep (it and
    the rollback copy) and to remove."""

    parent: str
    keep: list[str]
    remove: list[str]


@dataclass(frozen=True)
class BatchStep:
    batch: int
    # this host puts its release in place (rendered files, timers, ``current``) in this batch
    place: bool
    # hosts of the topology whose failure skips this batch (those of earlier batches)
    unless_failed: tuple[str, ...]
    # this host's units of this batch: (stage, unit, release, current state)
    units: list[tuple[int, str, str, UnitState | None]]
    # their smoke checks (``operations.serving.verified``)
    checks: list[SmokePlan]
    # the engine unit of this batch that climbs the context ladder instead (left out of ``units``
    # and ``checks``: hostside/ladder.py starts and checks it rung by rung)
    climbs: bool = False
    # on a router host, after the smoke tests: the engines of this batch its router must send to
    # again before the next batch goes (``kimi_deploy.serving.router_view``), or None
    router_view: RouterViewRequest | None = None
    # on a router host, around the batch: the engines of this batch its running router stops
    # sending to before they restart and sends to again once they answer
    # (``kimi_deploy.serving.router_drain``), or None
    drain: DrainRequest | None = None


@dataclass(frozen=True)
class Steps:
    # why this host must not change anything (a port another process holds), or None
    refusal: str | None
    preflight_failures: list[str]
    releases: list[ReleaseStep]
    # uv, which installs them, and its folder
    uv: str
    uv_dir: str
    # what the host reported its releases are built for (unchecked: ``release_lock.HostPlatform``),
    # the platform the controller resolves their locks for
    platform: Any
    hub_token: RenderedFile | None
    # each checkpoint the host holds, the model first (none on a router host)
    weights: list[WeightsSteps]
    # the communication check of a topology whose hosts talk to each other: its request (None:
    # nothing of the topology (re)starts, ``comm_check_why`` says so); absent for other topologies
    comm_check: bool
    comm_check_request: CommCheckRequest | None
    comm_check_why: str
    all_reduce_request: AllReduceRequest | None
    all_reduce_why: str
    batches: list[BatchStep]
    # before the first batch: the smoke checks of this host's units still starting (running what
    # the plan says, but not found serving since they last (re)started: a converge that stopped
    # before their smoke test, or systemd's restart after a crash), waited for before any unit of
    # the topology restarts; and the topology's hosts that wait so (a failure there stops the batches)
    waiting: list[SmokePlan]
    waiting_hosts: tuple[str, ...]
    # the topology's instances, ``(pool, instance)``, that do not serve now: they restart first
    down: frozenset[tuple[str, int]]
    # on a router host, before the first batch: the engines a drain took out of its router and
    # did not put back (a converge that stopped in between), put back (``kimi_deploy.serving.router_drain``)
    readmit: DrainRequest | None
    # each checkpoint's old revisions, once the planned ones serve
    collect: list[CollectStep]
    # the units this converge (re)starts on this host
    restarting: frozenset[str]
    # the context ladder this host's engine climbs (``kimi_deploy.serving.context_ladder``), or None
    climb: Climb | None = None
    # before anything changes: this host restarts the serving engine of its pool's only instance,
    # which leaves the pool without service until it answers again (its last restart's gap said)
    only_restart: str | None = None
    # each engine unit's compile cache: served, placed and given before the starts, packed after
    compile_caches: tuple[CompileCacheStep, ...] = ()


def weights_host(deploy: DeployPlan, todo: Converge, probed: Any, slot: int = 0) -> WeightsHost:
    """A host of the run as the fan-out of its ``slot``-th checkpoint (0: the model, 1: a draft)
    sees it (``probed``: its probe's answer, or the exception its probe raised)."""
    target = todo.checkpoints[slot] if slot < len(todo.checkpoints) else None
    if target is None or not isinstance(probed, dict):
        return WeightsHost(deploy.spec.host, deploy.host.address, None, None, None)
    wants = (target.repo, target.revision, target.path)
    found = probed["weights"].get(target.path)
    return WeightsHost(deploy.spec.host, deploy.host.address, wants, target.fan_out_port, found, target.full_verify)


def plan_fan_outs(hosts: Sequence[tuple[DeployPlan, Converge, Any]]) -> list[dict[str, FanOutPart]]:
    """Each checkpoint slot's fan-out (``plan_fan_out``) over ``hosts`` (each: its plan, its
    converge and its probe's answer, in run order): the model's, then the drafts'; hosts holding
    the same checkpoint share a group whatever their topology."""
    slots = max((len(todo.checkpoints) for _, todo, _ in hosts), default=0)
    return [plan_fan_out([weights_host(*h, slot) for h in hosts]) for slot in range(slots)]


def run_view(
    me: str,
    todos: Mapping[str, tuple[DeployPlan, Converge]],
    probed: Mapping[str, Any],
    *,
    in_topology: Sequence[HostPlan],
    fan_out: Sequence[Mapping[str, FanOutPart]],
    run_id: str,
    transfer_key: str,
    compile_caches: Mapping[str, Sequence[CompileCacheStep]] | None = None,
    shared: dict[str, Any] | None = None,  # a memo of values of several kinds (RunView.shared)
) -> RunView:
    """Host ``me``'s view of the run: ``todos``, its own converge and those of ``in_topology`` (the
    hosts of its topology the run covers); ``probed``, every host's answer (or the exception its
    probe raised); ``fan_out``, ``plan_fan_outs`` of every host; ``shared``, the ``RunView.shared``
    of the other views of its topology in this run (None: a view of its own)."""
    peers: dict[str, tuple[Converge, HostState | None]] = {}
    for p in in_topology:
        found = probed.get(p.host)
        peers[p.host] = (todos[p.host][1], cast(HostState, found) if isinstance(found, dict) else None)
    return RunView(
        run_id=run_id,
        transfer_key=transfer_key,
        in_topology=tuple(in_topology),
        peers=peers,
        fan_out=tuple(slot[me] for slot in fan_out)[: len(todos[me][1].checkpoints)],
        compile_caches=tuple((compile_caches or {}).get(me, ())),
        shared={} if shared is None else shared,
    )


def restarts(todo: Converge, found: HostState) -> frozenset[str]:
    """The units of ``todo`` that (re)start on a host whose probe found ``found``."""
    return frozenset(u.name for u in todo.units if needs_start(u.release, unit_state(u, found)))


def _shared(run: RunView, name: str, work: Callable[[RunView], Any]) -> Any:
    """``work(run)``, once for the views that share ``run.shared`` (the hosts of one topology)."""
    if name not in run.shared:
        run.shared[name] = work(run)
    return run.shared[name]


def restarting_hosts(run: RunView) -> list[str]:
    """Hosts of this topology in the run where some unit will (re)start, or that could not be
    probed (down, unreachable): the communication check is needed then."""
    return list(_shared(run, "restarting", _restarting_hosts))


def _restarting_hosts(run: RunView) -> list[str]:
    out = []
    for peer in run.in_topology:
        todo, found = run.peers.get(peer.host, (None, None))
        # the watchdog's own restart moves nothing the check is about
        if todo is None or found is None or restarts(todo, found) - {WATCHDOG_UNIT}:
            out.append(peer.host)
    return out


def _weights(todo: Converge, found: HostState, run: RunView) -> list[WeightsSteps]:
    """Each checkpoint's steps, in the converge's order (the model first)."""
    out = []
    for target, fan_out in zip(todo.checkpoints, run.fan_out, strict=True):
        port = target.fan_out_port
        key = None
        if fan_out.serves or fan_out.sync == "peers":
            key = transfer_key_file(target, run.transfer_key)
        current = found["weights"].get(target.path)
        out.append(
            WeightsSteps(
                sync=sync_request(target),
                python=target.python,
                current=current,
                mirror=[{"host": "mirror", "path": target.mirror}] if target.mirror else [],
                full_verify=target.full_verify,
                key=key,
                key_file=target.peer_key_file,
                serves=fan_out.serves,
                arriving=needs_files(current),
                port=port,
                path=target.path,
                lock=target.lock,
                peers=[{"host": p.host, "url": f"http://{p.address}:{port}"} for p in fan_out.peers]
                if port is not None and fan_out.sync == "peers"
                else [],
            )
        )
    return out


def _collect(todo: Converge, found: HostState) -> list[CollectStep]:
    """Each checkpoint's folder of revisions: all but the planned one and the rollback copy go."""
    out = []
    for target in todo.checkpoints:
        parent = target.path.rsplit("/", 1)[0]
        revisions = found["revisions"].get(parent)
        if revisions is None:
            continue
        planned = target.revision
        remove = collectable(revisions["present"], revisions["history"], planned)
        keep = [r for r in revisions["present"] if r not in remove] or [planned]
        out.append(CollectStep(parent, keep, remove))
    return out


def starting(u: UnitTarget, state: UnitState | None) -> bool:
    """Whether ``u``, which this converge leaves running, is still starting: no smoke test found
    it serving since the deploy last (re)started it (a converge that stopped before its smoke
    test), or systemd restarted it on its own (it crashed) since one last did."""
    if u.smoke is None or state is None or needs_start(u.release, state):
        return False
    return not state["verified"] or state["restarts"] > state["restarts_verified"]


def _check(u: UnitTarget, restarted: bool, restarts: int, only: str | None) -> SmokePlan:
    """The smoke check of ``u`` (``operations.serving.verified``); ``only`` kept for an engine."""
    assert u.smoke is not None
    return {
        "unit": u.name,
        "url": u.smoke.url,
        "request": u.smoke.request,
        "restarted": restarted,
        "restarts": restarts,
        "only": only if u.stage in ENGINES else None,
    }


def _smoke_checks(units: Sequence[UnitTarget], found: HostState, only: str | None = None) -> list[SmokePlan]:
    """The smoke checks of ``units`` in their batch: those this converge (re)starts are checked.
    ``only``: the pool (``TOPOLOGY/POOL``) of which they are the only instance, else None."""
    return [_check(u, needs_start(u.release, unit_state(u, found)), 0, only) for u in units if u.smoke is not None]


def _waiting(units: Sequence[UnitTarget], found: HostState, only: str | None = None) -> list[SmokePlan]:
    """The smoke checks of ``units`` still starting (``starting``), waited for before the batches."""
    checks = []
    for u in units:
        state = unit_state(u, found)
        if u.smoke is not None and state is not None and starting(u, state):
            checks.append(_check(u, True, state["restarts"], only))
    return checks


def only_restart(only: str | None, todo: Converge, found: HostState, restarting: Collection[str]) -> str | None:
    """What restarting the only instance of this host's pool (``only``: ``only_instance``) costs
    its clients, in one line, when this host restarts an engine of it that serves now; None
    otherwise (several instances, a first start, nothing restarting)."""
    if only is None:
        return None
    for u in todo.units:
        state = found["units"].get(u.name)
        if u.stage in ENGINES and u.name in restarting and state is not None and state.get("active") == "active":
            last = state.get("down_s")
            said = f"; its last restart: {last:.0f} s" if isinstance(last, (int, float)) else ""
            return f"{only}: restarting the only instance ({u.name}): no service until it answers again{said}"
    return None


def down_instances(run: RunView) -> frozenset[tuple[str, int]]:
    """The instances of this host's topology that do not serve now: an engine of theirs not
    running (stopped, failed, never started, systemd restarting it), or a host of theirs that did
    not answer the probe. One still starting is waited for before the batches: not down."""
    found: frozenset[tuple[str, int]] = _shared(run, "down", _down_instances)
    return found


def _down_instances(run: RunView) -> frozenset[tuple[str, int]]:
    out = set()
    for peer in run.in_topology:
        if peer.role == "router":
            continue
        todo, found = run.peers.get(peer.host, (None, None))
        if todo is None or found is None:
            out.add((peer.pool, peer.instance))
            continue
        for u in todo.units:
            state = found["units"].get(u.name)
            if u.stage in ENGINES and (state is None or state.get("active") != "active"):
                out.add((peer.pool, peer.instance))
    return frozenset(out)


def waiting_hosts(run: RunView) -> tuple[str, ...]:
    """The hosts of this host's topology with a unit still starting (``starting``)."""
    found: tuple[str, ...] = _shared(run, "waiting", _waiting_hosts)
    return found


def _waiting_hosts(run: RunView) -> tuple[str, ...]:
    out = []
    for peer in run.in_topology:
        todo, found = run.peers.get(peer.host, (None, None))
        if todo is not None and found is not None and _waiting(todo.units, found):
            out.append(peer.host)
    return tuple(out)


def _batches(
    deploy: DeployPlan,
    todo: Converge,
    found: HostState,
    climb: Climb | None,
    restarting: Collection[str],
    *,
    down: frozenset[tuple[str, int]] = frozenset(),
    waiting: tuple[str, ...] = (),
    only: str | None = None,
) -> list[BatchStep]:
    """Every batch of the start order (each host takes every one: they are barriers across hosts).
    ``down``: the instances that do not serve now, which go first; ``waiting``: the hosts whose
    units still starting are waited for before the first batch (one that fails stops them all);
    ``only``: this host's pool when it has a single instance (``only_instance``).
    A batch goes only if none of those failed, nor a host of an earlier batch, nor another host of
    this host's own instance (one that dropped off the network during the run)."""
    spec, topology = deploy.spec, deploy.topology
    mine, place = batch_of(spec, topology, down), first_batch_of(spec, topology, down)
    router = found["units"].get(ROUTER_UNIT)
    running = router is not None and router.get("active") == "active"
    out = []
    for batch in range(BATCHES):
        units = [u for u in todo.units if unit_batch(u.stage, mine) == batch]
        climbs = climb is not None and any(u.name == climb.unit for u in units)
        units = [u for u in units if climb is None or u.name != climb.unit]
        # a batch waits for the hosts of the earlier ones, and for the router hosts, whose router
        # had to take the earlier batch's engines back
        earlier = waiting + tuple(
            p.host
            for p in topology
            if p.host not in waiting
            and (
                (batch and (first_batch_of(p, topology, down) < batch or p.role == "router"))
                # a member of its own instance: an instance never restarts on some of its hosts alone
                or (p.host != spec.host and p.role != "router" and (p.pool, p.instance) == (spec.pool, spec.instance))
            )
        )
        out.append(
            BatchStep(
                batch=batch,
                place=batch == place,
                unless_failed=earlier,
                units=[(u.stage, u.name, u.release, unit_state(u, found)) for u in units],
                checks=_smoke_checks(units, found, only),
                climbs=climbs,
                router_view=view_request(
                    deploy.recipe, spec, topology, batch, restarting=restarting, running=running, down=down
                ),
                drain=drain_request(
                    deploy.recipe, spec, topology, batch, restarting=restarting, running=running, down=down
                ),
            )
        )
    return out


def _proofs(run: RunView) -> list[LadderProof]:
    return [p for _, seen in run.peers.values() if seen is not None for p in seen.get("ladder") or []]


def converge_steps(deploy: DeployPlan, todo: Converge, found: HostState, run: RunView) -> Steps:
    """Every step of ``deploy``'s host's converge, from its probe's answer ``found``."""
    spec, recipe = deploy.spec, deploy.recipe
    restarting = restarts(todo, found)
    conflicts = port_conflicts(todo, found["listeners"], restarting)
    comm_check = needs_check(deploy.topology)
    hosts = restarting_hosts(run)
    all_reduce_why = all_reduce_why_not(recipe, spec, run.in_topology)
    if all_reduce_why is None and not any(h.host in hosts for h in members(spec, run.in_topology)):
        all_reduce_why = f"no engine of instance {instance_label(spec)} starts or restarts"
    # A rung is proven once for the topology's hosts of the same hardware and release.
    proofs = _shared(run, "proofs", _proofs)
    down, waiting = down_instances(run), waiting_hosts(run)
    only = only_instance(spec, deploy.topology)
    climb = climb_for(deploy, todo, found, proofs)
    # A damaged release is rebuilt from its own lock; any other is installed from the lock the
    # controller resolves for this host's platform.
    markers = [found["venvs"].get(r.path) for r in todo.venvs]
    releases = [ReleaseStep(r, lock_source(m), m) for r, m in zip(todo.venvs, markers, strict=True)]
    return Steps(
        # Before any change on any host: starting would fail, and the running release must stay.
        refusal=f"{spec.host}: {conflicts[0]}" if conflicts else None,
        preflight_failures=preflight_check(
            preflight_needs(todo, deploy, found), found["hardware"] or parse_profile({})
        ),
        releases=releases,
        platform=found.get("platform"),
        uv=recipe.tools.uv,
        uv_dir=tool_dir(recipe, "uv", recipe.tools.uv),
        hub_token=todo.weights.token if todo.weights is not None else None,
        weights=_weights(todo, found, run),
        # Before anything of the new release is put in place: a failed check leaves every host of
        # the topology exactly as it was (files, current release, running engines).
        comm_check=comm_check,
        comm_check_request=check_request(recipe, spec, run.in_topology, run.run_id) if comm_check and hosts else None,
        comm_check_why=f"no engine of topology {spec.topology} starts or restarts",
        # Then each engine instance's own communicator, when an engine of the instance (re)starts.
        all_reduce_request=None if all_reduce_why else all_reduce_request(recipe, spec, run.in_topology, run.run_id),
        all_reduce_why=all_reduce_why or "",
        batches=_batches(deploy, todo, found, climb, hosts, down=down, waiting=waiting, only=only),
        waiting=_waiting(todo.units, found, only),
        waiting_hosts=waiting,
        down=down,
        readmit=readmit_request(recipe, spec, deploy.topology, found.get("router_drained") or [], down=down),
        collect=_collect(todo, found),
        restarting=restarting,
        climb=climb,
        only_restart=only_restart(only, todo, found, restarting),
        compile_caches=run.compile_caches,
    )
