"""The steps of a converge, decided without pyinfra (``kimi_deploy.converge.steps``): for the cases
the end-to-end tests run on real hosts (a new host, a no-op, an engine change, a revision change,
going back to earlier pins, a host of the second batch), on the example recipe's prefill/decode
topology (gb300-pd: three prefill instances over two hosts each, one decode instance over four,
a router host with the Mooncake master and the gateway).

Each host's probe answer is written as ``hostside/state_probe.py`` gives it for a host in that
state (``probe``); every host of the run is planned as ``deploys/kimi.py`` plans it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kimi_deploy.converge.plan import Converge, needs_start
from kimi_deploy.converge.steps import Steps, WeightsSteps, converge_steps, plan_fan_outs, run_view
from kimi_deploy.hostside.probe_types import Listener
from kimi_deploy.inventory import Inventory
from kimi_deploy.plan.deploy_plan import DeployPlan, part_of
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe import Recipe
from tests.conftest import RECIPE
from tests.host_converge import LOCK, host_converge, lock_stands_in
from tests.host_converge import probe_answer as probe

TOPOLOGY = "gb300-pd"
RUN = "20261202T000000Z-ab12cd34"


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    lock_stands_in(monkeypatch, LOCK)
    monkeypatch.setenv("KIMI_API_KEY", "sk-kimi-d41c9a0e77b2")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", "/nonexistent/token")


def _plans(recipe: Recipe, prod: Inventory) -> dict[str, tuple[DeployPlan, Converge]]:
    whole = plan(recipe, RECIPE, prod)
    out = {}
    for spec in whole.topology(TOPOLOGY):
        deploy = part_of(recipe, RECIPE, prod.host(spec.host), whole)
        out[spec.host] = (deploy, host_converge(recipe, prod, spec.host))
    return out


def steps_of(
    me: str,
    plans: Mapping[str, tuple[DeployPlan, Converge]],
    probed: Mapping[str, Any],
    shared: dict[str, Any] | None = None,  # RunView.shared: a memo of values of several kinds
) -> Steps:
    """``me``'s steps in a run of every host of the topology, as the deploy decides them
    (``shared``: what the topology's views share, as ``converge_run.view_of`` gives them)."""
    deploy, todo = plans[me]
    order = list(plans)
    fan_out = plan_fan_outs([(*plans[h], probed[h]) for h in order])
    view = run_view(
        me,
        plans,
        probed,
        in_topology=deploy.topology,
        fan_out=fan_out,
        run_id=RUN,
        transfer_key="k" * 43,
        shared=shared,
    )
    return converge_steps(deploy, todo, probed[me], view)


def _started(steps: Steps) -> dict[int, list[str]]:
    """Batch -> the units it (re)starts (``operations.units.started`` decides with ``needs_start``)."""
    out: dict[int, list[str]] = {}
    for batch in steps.batches:
        for _, name, release, current in batch.units:
            if needs_start(release, current):
                out.setdefault(batch.batch, []).append(name)
    return out


def _serves(weights: WeightsSteps) -> bool:
    """Whether the host serves its files to peers (``deploys/kimi.py``'s "Weights served to peers")."""
    return bool(weights.serves) and weights.port is not None


def test_a_new_host_installs_fetches_checks_and_starts_everything(recipe: Recipe, prod: Inventory) -> None:
    plans = _plans(recipe, prod)
    probed = {h: probe(todo, installed=False, running=False) for h, (_, todo) in plans.items()}
    steps = steps_of("gb300-p01", plans, probed)
    assert steps.refusal is None
    assert steps.preflight_failures == []
    assert [s.current for s in steps.releases] == [None, None]
    # no host holds a release: each is installed from the lock the controller resolves
    assert [s.lock.kind if s.lock else None for s in steps.releases] == ["controller"] * 2
    # the first host of the group fetches from the Hub and serves the others
    weights = steps.weights[0]
    assert (weights.peers, _serves(weights)) == ([], True)  # from the Hub
    assert weights.key is not None
    assert weights.key.secret
    other = steps_of("gb300-d02", plans, probed).weights[0]
    # every other host of the group fetches in a chain: from the host before it first (it relays
    # what it receives), the chain's source last; and serves the hosts after it
    assert (bool(other.peers), other.arriving) == (True, True)
    assert [p["host"] for p in other.peers] == ["gb300-d01", "gb300-p06", "gb300-p05", "gb300-p01"]
    assert set(other.serves) == {"10.41.0.33", "10.41.0.34"}  # gb300-d03 and d04
    # nothing of the topology runs yet: every host (re)starts, so both checks run
    assert steps.comm_check
    assert steps.comm_check_request is not None
    assert (steps.all_reduce_request is None) == bool(steps.all_reduce_why)
    # the engine, then its host's watchdog (which starts last)
    assert _started(steps) == {0: ["kimi-vllm", "kimi-watchdog"]}
    assert steps.restarting == {"kimi-vllm", "kimi-watchdog"}
    assert [b.place for b in steps.batches] == [True, False, False]


def test_a_converged_topology_is_a_no_op(recipe: Recipe, prod: Inventory) -> None:
    plans = _plans(recipe, prod)
    probed = {h: probe(todo) for h, (_, todo) in plans.items()}
    for host in plans:
        steps = steps_of(host, plans, probed)
        assert steps.refusal is None
        assert steps.restarting == frozenset(), host
        assert _started(steps) == {}, host
        assert steps.comm_check_request is None
        assert steps.comm_check_why == f"no engine of topology {TOPOLOGY} starts or restarts"
        assert steps.all_reduce_request is None
        assert [s.lock for s in steps.releases] == [None] * len(steps.releases)
        for w in steps.weights:
            assert (w.peers, _serves(w), w.key) == ([], False, None)
        # nothing to collect: only the planned revision is present
        assert all(c.remove == [] for c in steps.collect)
        assert not any(c["restarted"] for b in steps.batches for c in b.checks)


def _with(recipe: Recipe, **changes: Any) -> Recipe:
    """``recipe`` with ``engines.vllm.version`` or ``model.revision`` changed (a new engine pin has
    no committed lock until `kimi-deploy lock` runs: the recipe names no OS then, and its hosts'
    locks are resolved during the converge)."""
    if "vllm" in changes:
        release = recipe.engines["vllm"].model_copy(update={"version": changes["vllm"]})
        return recipe.model_copy(update={"engines": {**recipe.engines, "vllm": release}, "os": None})
    return recipe.model_copy(update={"model": recipe.model.model_copy(update={"revision": changes["revision"]})})


def test_an_engine_change_installs_the_release_and_restarts_every_engine_in_its_batch(
    recipe: Recipe, prod: Inventory
) -> None:
    before = _plans(recipe, prod)
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    first, second, router = (steps_of(h, after, probed) for h in ("gb300-p01", "gb300-p03", "gb300-rt01"))
    assert first.releases[0].release.path.endswith(
        "/vllm-0.34.1+fastsafetensors-0.5.0+mooncake-transfer-engine-cuda13-0.3.13.post1+nixl-1.5.1"
    )
    assert first.releases[0].current is None  # a new release folder: installed beside the old one
    assert first.releases[0].lock is not None
    assert first.restarting == {"kimi-vllm"}
    assert first.comm_check_request is not None
    assert _started(first) == {0: ["kimi-vllm"]}
    assert _started(second) == {1: ["kimi-vllm"]}
    # the router's units read no engine release: they stay
    assert router.restarting == frozenset()
    assert _started(router) == {}


def test_restarting_the_only_instance_of_a_pool_is_said_before_with_its_last_gap(
    recipe: Recipe, prod: Inventory
) -> None:
    """An engine upgrade restarts the decode pool's only instance: its leader says so before any
    change, with how long its last restart left the pool without service (the smoke test's record);
    a prefill instance, one of three, says nothing; its smoke check names the pool for the gap line."""
    before = _plans(recipe, prod)
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    assert steps_of("gb300-d01", after, probed).only_restart == (
        "gb300-pd/decode: restarting the only instance (kimi-vllm): no service until it answers again"
    )
    probed["gb300-d01"] = _units_of(probed["gb300-d01"], down_s=412.6)
    decode = steps_of("gb300-d01", after, probed)
    assert decode.only_restart == (
        "gb300-pd/decode: restarting the only instance (kimi-vllm): no service until it answers again; "
        "its last restart: 413 s"
    )
    assert [(c["unit"], c["only"]) for b in decode.batches for c in b.checks if c["restarted"]] == [
        ("kimi-vllm", "gb300-pd/decode")
    ]
    prefill = steps_of("gb300-p01", after, probed)
    assert prefill.only_restart is None
    assert {c["only"] for b in prefill.batches for c in b.checks} == {None}
    # a first start takes no service away; nor does a converge that restarts nothing
    assert (
        steps_of("gb300-d01", after, {**probed, "gb300-d01": probe(before["gb300-d01"][1], running=False)}).only_restart
        is None
    )
    assert steps_of("gb300-d01", before, probed).only_restart is None


def test_a_revision_change_fetches_it_restarts_the_engines_and_keeps_the_old_one_for_a_rollback(
    recipe: Recipe, prod: Inventory
) -> None:
    old = recipe.model.revision
    new = "1" * 40
    after = _plans(_with(recipe, revision=new), prod)
    before = _plans(recipe, prod)
    probed = {}
    for h in after:
        was = probe(before[h][1], revisions=[old])
        # the planned revision's folder is new: absent
        absent = {"exists": False, "missing": list(LOCK), "unverified": [], "extra": []}
        model = {c.path: absent for c in after[h][1].checkpoints[:1]}  # none on the router's host
        probed[h] = {**was, "weights": {**was["weights"], **model}}
    steps = steps_of("gb300-p01", after, probed)
    assert steps.weights[0].sync["revision"] == new
    assert steps.weights[0].peers == []  # from the Hub
    # the watchdog reads the new revision's scrub result
    assert steps.restarting == {"kimi-vllm", "kimi-watchdog"}
    assert (steps.collect[0].keep, steps.collect[0].remove) == ([old], [])
    # once the next revision serves, the oldest goes and the previous one stays
    parent = steps.collect[0].parent
    three = {"present": ["0" * 40, old, new], "history": ["0" * 40, old, new]}
    revisions = probe(before["gb300-p01"][1], revisions=[old])["revisions"]
    later = {**probed["gb300-p01"], "revisions": {**revisions, parent: three}}
    collect = steps_of("gb300-p01", after, {**probed, "gb300-p01": later}).collect[0]
    assert (collect.keep, collect.remove) == ([old, new], ["0" * 40])


def test_converging_back_to_earlier_pins_returns_to_the_earlier_release(recipe: Recipe, prod: Inventory) -> None:
    """The rollback target: after a converge to other pins, the earlier pins plan the earlier
    release again, byte for byte (its folder, its units' digests), and only its units restart."""
    earlier = _plans(recipe, prod)
    later = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in later.items()}
    steps = steps_of("gb300-p01", earlier, probed)
    todo = earlier["gb300-p01"][1]
    assert todo.release.dir != later["gb300-p01"][1].release.dir
    assert todo.release == _plans(recipe, prod)["gb300-p01"][1].release
    assert steps.restarting == {"kimi-vllm"}
    assert [b.place for b in steps.batches] == [True, False, False]
    assert steps.releases[0].release.path.endswith(
        "/vllm-0.33.0+fastsafetensors-0.5.0+mooncake-transfer-engine-cuda13-0.3.13.post1+nixl-1.5.1"
    )
    # converged back, the next run is a no-op again
    back = {h: probe(t) for h, (_, t) in earlier.items()}
    assert steps_of("gb300-p01", earlier, back).restarting == frozenset()


def test_a_host_of_the_second_batch_waits_for_the_first(recipe: Recipe, prod: Inventory) -> None:
    before = _plans(recipe, prod)
    plans = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    steps = steps_of("gb300-p03", plans, probed)  # prefill instance 1: the odd instances go second
    assert steps.down == frozenset()
    assert [b.place for b in steps.batches] == [False, True, False]
    assert steps.batches[0].units == []
    assert [u[1] for u in steps.batches[1].units] == ["kimi-vllm", "kimi-watchdog"]
    first = {p.host for p in plans["gb300-p03"][0].topology} - {"gb300-p03", "gb300-p04"}
    # the first batch: the even prefill instances, the decode instance and the router host,
    # whose Mooncake master (a store) starts first
    # and its own instance's worker, gb300-p04: an instance never restarts on some of its hosts
    # alone (one that dropped off the network during the run fails before this batch's steps)
    assert set(steps.batches[1].unless_failed) == first | {"gb300-p04"}
    assert steps.batches[0].unless_failed == ("gb300-p04",)
    assert steps_of("gb300-p04", plans, probed).batches[0].unless_failed == ("gb300-p03",)
    # a single-host instance waits on no other host in its first batch
    assert steps_of("gb300-rt01", plans, probed).batches[0].unless_failed == ()
    new = {h: probe(todo, running=False) for h, (_, todo) in plans.items()}
    router = steps_of("gb300-rt01", plans, new)
    assert [b.place for b in router.batches] == [True, False, False]
    assert [u[1] for u in router.batches[0].units] == ["kimi-mooncake-master"]
    assert sorted(u[1] for u in router.batches[2].units) == ["kimi-gateway", "kimi-router"]
    # the routers' batch waits for every host of both batches (the router host's own store too)
    assert set(router.batches[2].unless_failed) == set(plans)


def _units_of(answer: Any, **state: Any) -> Any:
    """``answer`` with each engine unit's state updated by ``state``."""
    return answer | {"units": {n: u | state if n == "kimi-vllm" else u for n, u in answer["units"].items()}}


def test_nothing_serving_starts_every_instance_in_the_first_batch(recipe: Recipe, prod: Inventory) -> None:
    """A new topology has nothing to keep serving: its instances start at once."""
    plans = _plans(recipe, prod)
    probed = {h: probe(todo, running=False) for h, (_, todo) in plans.items()}
    for host in ("gb300-p01", "gb300-p03", "gb300-p06", "gb300-d02"):
        steps = steps_of(host, plans, probed)
        assert len(steps.down) == 4  # three prefill instances and the decode one
        assert [b.place for b in steps.batches] == [True, False, False], host
        assert [u[1] for u in steps.batches[0].units] == ["kimi-vllm", "kimi-watchdog"], host


def test_an_instance_that_does_not_serve_restarts_first_and_one_that_serves_stays_up(
    recipe: Recipe, prod: Inventory
) -> None:
    """Prefill instance 0's engine failed (its leader's unit inactive): an upgrade restarts it
    first, with instance 2 (every other one that serves, from the second on), while instance 1
    serves until they answer. In the plan's order instance 0 and 2 go first too, but instance 1
    would have been the only one serving: here it is the one kept."""
    before = _plans(recipe, prod)
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    probed["gb300-p01"] = _units_of(probed["gb300-p01"], active="failed", sub="failed")
    batch = {h: [b.place for b in steps_of(h, after, probed).batches].index(True) for h in after}
    assert steps_of("gb300-p05", after, probed).down == {("prefill", 0)}
    assert [h for h in after if batch[h] == 1] == ["gb300-p03", "gb300-p04"]
    # instance 1 down instead: 0 and 2 serve; 2 (the second of them) goes first with 1, 0 stays up
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    probed["gb300-p04"] = _units_of(probed["gb300-p04"], active="activating", sub="auto-restart")
    batch = {h: [b.place for b in steps_of(h, after, probed).batches].index(True) for h in after}
    assert [h for h in after if batch[h] == 1] == ["gb300-p01", "gb300-p02"]
    # a host that did not answer the probe: its instance is not known to serve
    answers: dict[str, Any] = {h: probe(todo) for h, (_, todo) in before.items()}
    answers["gb300-p06"] = OSError("timed out")
    assert steps_of("gb300-p01", after, answers).down == {("prefill", 2)}


def test_a_unit_still_starting_is_waited_for_before_any_batch(recipe: Recipe, prod: Inventory) -> None:
    """A converge that stopped between restarting prefill instance 0 and its smoke test: the unit
    runs the planned release, but no smoke test found it serving since. The next run restarts
    nothing there; it waits for it (a smoke check of a unit (re)started) before the first batch,
    on every host of the topology, and a failure there stops every batch."""
    plans = _plans(recipe, prod)
    probed = {h: probe(todo) for h, (_, todo) in plans.items()}
    probed["gb300-p01"] = _units_of(probed["gb300-p01"], verified=False)
    leader = steps_of("gb300-p01", plans, probed)
    assert leader.restarting == frozenset()
    assert [(c["unit"], c["restarted"], c["restarts"]) for c in leader.waiting] == [("kimi-vllm", True, 0)]
    assert not any(c["restarted"] for b in leader.batches for c in b.checks)
    for host in plans:
        steps = steps_of(host, plans, probed)
        assert steps.waiting_hosts == ("gb300-p01",), host
        assert steps.down == frozenset(), host  # starting is not down: it is waited for
        assert all(b.unless_failed[:1] == ("gb300-p01",) for b in steps.batches), host
        if host != "gb300-p01":
            assert steps.waiting == [], host
    # the same with an upgrade: the second batch's hosts keep serving until it and the first answer
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    assert "gb300-p01" in steps_of("gb300-p03", after, probed).batches[1].unless_failed
    # a unit systemd restarted on its own since its last smoke test is checked the same way
    probed["gb300-p01"] = _units_of(probe(plans["gb300-p01"][1]), restarts=2, restarts_verified=1)
    assert [(c["restarted"], c["restarts"]) for c in steps_of("gb300-p01", plans, probed).waiting] == [(True, 2)]
    # verified since its last start, restarts all seen: nothing to wait for
    probed["gb300-p01"] = _units_of(probe(plans["gb300-p01"][1]), restarts=2, restarts_verified=2)
    assert steps_of("gb300-p01", plans, probed).waiting == []
    assert steps_of("gb300-p03", plans, probed).waiting_hosts == ()


def test_a_port_held_by_another_process_stops_the_host_before_any_change(recipe: Recipe, prod: Inventory) -> None:
    plans = _plans(recipe, prod)
    probed = {h: probe(todo) for h, (_, todo) in plans.items()}
    held: dict[str, Listener] = {"8000": {"pid": 4242, "comm": "python3", "unit": ""}}
    probed["gb300-p01"] = probed["gb300-p01"] | {"listeners": held}
    steps = steps_of("gb300-p01", plans, probed)
    assert steps.refusal == "gb300-p01: port 8000 (kimi-vllm api) is in use by pid 4242 (python3, no systemd unit)"


def test_the_next_batch_waits_for_the_running_router_to_send_to_the_one_before(recipe: Recipe, prod: Inventory) -> None:
    """An engine change restarts the prefill instances 0 and 2 and the decode instance first, then
    prefill instance 1: after each batch the router host waits until its running router sends to
    the instances that batch restarted (by the URLs the router knows them by), and the next batch
    goes only if that host did not fail."""
    before = _plans(recipe, prod)
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed = {h: probe(todo) for h, (_, todo) in before.items()}
    router = steps_of("gb300-rt01", after, probed)
    views = [b.router_view for b in router.batches]
    assert views[0] is not None
    assert views[1] is not None
    assert views[2] is None  # the routers' own batch
    assert views[0]["workers"] == ["http://10.41.0.11:8000", "http://10.41.0.15:8000", "http://10.41.0.31:8000"]
    assert views[1]["workers"] == ["http://10.41.0.13:8000"]
    assert {k: v for k, v in views[0].items() if k != "workers"} == {
        "router": "vllm-router",
        "metrics": "http://127.0.0.1:29000/metrics",
        "gauge": "vllm_router_worker_health",
        "circuit": "vllm_router_cb_state",
        "circuit_open_s": 10,
        # three rounds of router.health's checks, never less than a router on the 60 s default
        # needs, and the time a circuit stays open
        "timeout_s": 150 + 10,
    }
    # an engine host waits on no router itself; the second batch waits for the router host
    engine = steps_of("gb300-p03", after, probed)
    assert [b.router_view for b in engine.batches] == [None, None, None]
    assert "gb300-rt01" in engine.batches[1].unless_failed
    # nothing restarts: nothing to wait for
    assert [b.router_view for b in steps_of("gb300-rt01", before, probed).batches] == [None, None, None]
    # no router running (a new router host): it starts after every batch, with nothing to catch up on
    stopped = {**probed, "gb300-rt01": probe(before["gb300-rt01"][1], running=False)}
    assert [b.router_view for b in steps_of("gb300-rt01", after, stopped).batches] == [None, None, None]


def test_the_views_of_a_topology_work_out_its_peers_once_and_decide_as_each_alone(
    recipe: Recipe, prod: Inventory
) -> None:
    """What every host of a topology reads alike of the others (who restarts, which instances are
    down or starting, the ladder's proofs) is worked out by the first view and shared by the
    others: a run costs each host its own converge, not its topology's. Each host's steps are
    those it decides alone."""
    before = _plans(recipe, prod)
    after = _plans(_with(recipe, vllm="0.34.1"), prod)
    probed: dict[str, Any] = {h: probe(todo) for h, (_, todo) in before.items()}
    probed["gb300-p01"] = _units_of(probed["gb300-p01"], active="failed", sub="failed")
    probed["gb300-p06"] = OSError("timed out")
    answered = [h for h in after if isinstance(probed[h], dict)]
    shared: dict[str, Any] = {}
    together = {h: steps_of(h, after, probed, shared) for h in answered}
    assert set(shared) == {"restarting", "down", "waiting", "proofs"}
    assert together == {h: steps_of(h, after, probed) for h in answered}
    assert together["gb300-p05"].down == {("prefill", 0), ("prefill", 2)}
