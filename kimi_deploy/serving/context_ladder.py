"""The context ladder: which rungs a host's engine climbs in this converge, and the climb's request.

The deployment guides' advice for long contexts is to start small and go up one step at a time
(32K, 128K, 256K, then 1M), each step proven before the next. With ``context_probe`` in the
recipe, a converge that raises a topology's ``max_model_len`` does exactly that on each engine
host (``hostside/ladder.py``): every rung of ``context_ladder`` above the one serving and up to
the new length, unless proven already for the same engine release, hardware and topology, is
started, probed (``hostside/context_probe.py``) and recorded; the first that fails stops the
climb with the engine's own reason, and the highest rung that passed serves. Lowering the
length, or a restart at the length already serving, climbs nothing.

An instance spanning several hosts restarts in concert across them: its climb is not done yet,
and it restarts at the new length as before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kimi_deploy.converge.plan import Converge, UnitTarget, needs_start, unit_state
from kimi_deploy.engines import engine
from kimi_deploy.errors import ConfigError
from kimi_deploy.host.profile_types import HostProfile, HostState
from kimi_deploy.hostside.probe_types import LadderProof
from kimi_deploy.hostside.requests import LadderRequest, Rung
from kimi_deploy.plan.deploy_plan import DeployPlan
from kimi_deploy.recipe import Recipe
from kimi_deploy.render.files import RenderedFile


@dataclass(frozen=True)
class Climb:
    """The rungs ``unit`` climbs (rising, the topology's length last), and the rung it served
    before (None: none known), under the proofs' ``key``."""

    unit: str
    rungs: tuple[int, ...]
    back: int | None
    key: str
    hardware: str

    def lengths(self) -> list[int]:
        """Every length the climb renders the host at: its rungs, and the one to go back to."""
        return [*self.rungs, *([self.back] if self.back is not None else [])]


def recipe_at(recipe: Recipe, topology: str, length: int) -> Recipe:
    """``recipe`` with ``topology``'s ``max_model_len`` at ``length`` (one rung of its ladder)."""
    topo = recipe.topologies[topology].model_copy(update={"max_model_len": length})
    return recipe.model_copy(update={"topologies": {**recipe.topologies, topology: topo}})


def hardware_label(profile: HostProfile | None) -> str:
    """What of a host's hardware a proof holds for: its accelerators, or its CPU and memory."""
    if not profile:
        return "unknown"
    acc = profile["accelerators"]
    if acc["count"]:
        return f"{acc['count']} x {acc['model']} ({acc['memory_mib']} MiB)"
    cpu = profile["cpu"]
    total = profile["memory"]["total_bytes"]
    gib = f"{total >> 30} GiB" if total is not None else "unknown memory"
    return f"cpu: {cpu['count']} x {cpu['model']}, {gib}"


def proof_key(deploy: DeployPlan, hardware: str) -> str:
    """One digest of what a rung's proof holds for: the engine release, the hardware and the
    topology (all of it but its length), and the weights it serves."""
    recipe, spec = deploy.recipe, deploy.spec
    topology = recipe.topologies[spec.topology].model_dump(mode="json", exclude={"max_model_len"})
    what = {
        "engine": recipe.engines[spec.engine].model_dump(mode="json") if spec.engine in recipe.engines else None,
        "topology": [spec.topology, topology],
        "model": [recipe.model.repo, recipe.model.revision],
        "hardware": hardware,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def proven(proofs: Iterable[LadderProof], key: str, unit: str) -> set[int]:
    """The rungs ``unit`` passed under ``key``, as the host recorded them (a host's file: entries
    not of the expected shape prove nothing)."""
    out = set()
    for p in proofs:
        rung = p.get("rung") if isinstance(p, dict) else None
        if p.get("key") == key and p.get("unit") == unit and p.get("passed") is True and type(rung) is int:
            out.add(rung)
    return out


def rungs_to_climb(ladder: Sequence[int], target: int, serving: int | None, done: set[int]) -> tuple[int, ...]:
    """The ladder's rungs above ``serving`` (None: from the bottom) up to ``target`` that ``done``
    lacks, and ``target`` last when any is climbed; none when the length does not rise."""
    below = serving or 0
    if below >= target:
        return ()
    rungs = [r for r in ladder if below < r <= target and r not in done]
    if rungs and rungs[-1] != target:
        rungs.append(target)
    return tuple(rungs)


def _engine_unit(todo: Converge, deploy: DeployPlan) -> UnitTarget | None:
    names = {u.name for u in deploy.spec.units if u.kind == "engine"}
    return next((u for u in todo.units if u.name in names and u.smoke is not None), None)


def climb_for(deploy: DeployPlan, todo: Converge, found: HostState, proofs: Iterable[LadderProof] = ()) -> Climb | None:
    """The climb of this host's engine in this converge, or None: no ``context_probe``, an
    instance of several hosts, an engine that does not (re)start, or a length that does not rise
    past a rung not yet proven. ``proofs``: those of the topology's other hosts (a rung proven on
    one host of the same hardware and release is proven for all), besides this host's own."""
    recipe, spec = deploy.recipe, deploy.spec
    if recipe.context_probe is None or spec.nodes != 1:
        return None
    unit = _engine_unit(todo, deploy)
    if unit is None:
        return None
    state = unit_state(unit, found)
    if not needs_start(unit.release, state):
        return None
    hardware = hardware_label(found.get("hardware"))
    key = proof_key(deploy, hardware)
    # What the ladder last started it at, whether or not it runs now (an engine that crashed at the
    # length it served restarts there, with the smoke test's check of its weights).
    serving = state.get("context") if state is not None else None
    target = recipe.topologies[spec.topology].max_model_len
    done = proven([*(found.get("ladder") or []), *proofs], key, unit.name)
    rungs = rungs_to_climb(recipe.context_ladder, target, serving, done)
    if not rungs:
        return None
    return Climb(unit.name, rungs, serving, key, hardware)


def _unit_files(todo: Converge, unit: str) -> dict[str, RenderedFile]:
    return {f.path: f for f in todo.files if f"/{unit}." in f.path}


def climb_request(
    climb: Climb, deploy: DeployPlan, todo: Converge, at: Mapping[int, Converge], run_id: str
) -> LadderRequest:
    """``hostside/ladder.py``'s request: ``at`` is this host's converge at each of
    ``climb.lengths()`` (``recipe_at``), ``todo`` its converge at the topology's length."""
    recipe, spec = deploy.recipe, deploy.spec
    target = _unit_files(todo, climb.unit)
    # The files a rung changes (the unit's, its command line): written at each rung, and back.
    changed: set[str] = set()
    for length in climb.lengths():
        for path, f in _unit_files(at[length], climb.unit).items():
            if target.get(path) is None or target[path].sha256 != f.sha256:
                changed.add(path)
    for path in sorted(changed):
        mine = target.get(path)
        if mine is None or mine.secret or mine.owner != "root":
            raise ConfigError(
                deploy.recipe_file,
                f"topologies.{spec.topology}.max_model_len",
                f"{path} changes with the context length and is not a plain file of root's: the ladder cannot climb",
            )

    def rung(length: int) -> Rung:
        conv = at[length]
        unit = next(u for u in conv.units if u.name == climb.unit)
        files = _unit_files(conv, climb.unit)
        assert unit.smoke is not None  # _engine_unit's
        return {
            "rung": length,
            "release": unit.release,
            "files": [{"path": p, "content": files[p].content, "mode": files[p].mode} for p in sorted(changed)],
            "max_tokens": unit.smoke.request["max_tokens"],
        }

    smoke = next(u.smoke for u in todo.units if u.name == climb.unit)
    assert smoke is not None
    probe = recipe.context_probe
    assert probe is not None
    return {
        "unit": climb.unit,
        "rungs": [rung(r) for r in climb.rungs],
        "back": rung(climb.back) if climb.back is not None else None,
        "smoke": {**smoke.request, "unit": climb.unit, "url": smoke.url},
        "probe": {
            "needle": probe.needle,
            "question": probe.question,
            "expect": probe.expect,
            "fill": probe.fill,
            "depth": probe.depth,
            "max_tokens": probe.max_tokens,
            "timeout_s": probe.timeout_s,
        },
        "proof": {
            "key": climb.key,
            "topology": spec.topology,
            "engine": f"{spec.engine} {spec.engine_version}",
            "hardware": climb.hardware,
        },
        "release_dir": todo.release.dir,
        "run": run_id,
        "kv_metrics": list(engine(recipe.topologies[spec.topology].engine).kv_usage_metrics),
    }
