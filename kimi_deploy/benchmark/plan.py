"""What the serving benchmark sends, from where, to where (``deploys/bench.py``).

The load generator is ``vllm bench serve`` of the pinned vLLM release, so it runs on a host that
has that release and the weights' tokenizer: the first engine host of the benchmarked topology.
It drives the endpoint clients use: the topology's gateway (and through it the router), or, for a
topology without a router, its own host's engine. The hosted API it compares with is the
benchmark's ``compare`` entry, or else the topology's router fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kimi_deploy.accelerators import accelerator
from kimi_deploy.benchmark.types import BenchRequest, RequestTarget
from kimi_deploy.converge.plan import unit_key
from kimi_deploy.engines import engine as engine_kind
from kimi_deploy.plan.listen import LOOPBACK
from kimi_deploy.plan.servespec import HostPlan, Unit
from kimi_deploy.recipe import Benchmark, Recipe, RouterFallback
from kimi_deploy.recipe_file import RULES

# Where the generator host keeps the hosted API's key while the benchmark runs (root's alone;
# the host program removes it when done).
HOSTED_KEY = "/var/lib/kimi/bench-hosted.key"


@dataclass(frozen=True)
class Target:
    """An endpoint the tasks run against, and where the generator host reads its key."""

    name: str
    url: str
    model: str
    key_file: str | None
    key_var: str | None


def rows(bench: Benchmark, concurrency: int) -> list[int]:
    """The tasks (by index) one level sends, in order: every task ``rounds`` times, more rounds
    where that is fewer than twice ``concurrency`` requests."""
    tasks = len(bench.tasks)
    rounds = max(bench.rounds, math.ceil(2 * concurrency / tasks))
    return [i for _ in range(rounds) for i in range(tasks)]


def generator(topology: tuple[HostPlan, ...]) -> HostPlan | None:
    """The host the load generator runs on: the topology's first with an engine."""
    return next((p for p in topology if any(u.kind == "engine" for u in p.units)), None)


def _engine(plan: HostPlan) -> Unit:
    return next(u for u in plan.units if u.kind == "engine")


def _url(unit: Unit, port_label: str, plan: HostPlan, at: HostPlan) -> str:
    """``unit``'s API on ``plan``'s host as the generator host ``at`` reaches it. Only the
    generator's own engine may listen on loopback: a topology with a router (and so a gateway)
    is exposed (the recipe's rule)."""
    host = unit.bind
    if unit.bind in ("0.0.0.0", "::"):  # noqa: S104 - every address: loopback from its own host
        host = LOOPBACK if plan.host == at.host else plan.address
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{unit.listens[port_label]}"


def local_target(recipe: Recipe, topology: tuple[HostPlan, ...], at: HostPlan) -> Target:
    """The endpoint clients use, as the generator host ``at`` reaches it."""
    # the generator host's own gateway (in front of its engine), else the router's, if any
    gateways = [(p, u) for p in topology for u in p.units if u.kind == "gateway"]
    gateway = next(((p, u) for p, u in gateways if p.host == at.host), gateways[0] if gateways else None)
    engine = _engine(at)
    key_file, key_var = unit_key(recipe, at, engine)
    served = recipe.model.served_name
    if gateway is None:
        return Target("local", _url(engine, "api", at, at), served, key_file, key_var)
    plan, unit = gateway
    label = "router" if "router" in unit.listens else "api"
    return Target("local", _url(unit, label, plan, at), served, key_file, key_var)


def bench_topology(recipe: Recipe) -> str | None:
    """The topology the benchmark drives: its own, or the first served by an engine whose
    release holds the load generator (``Engine.load_generator``, as the recipe's rules name them)."""
    return recipe.bench_topology(RULES.load_generators())


def hosted(recipe: Recipe) -> RouterFallback | None:
    """The hosted API the tasks also run against, if any."""
    bench, name = recipe.benchmark, bench_topology(recipe)
    if bench is None or name is None:
        return None
    router = recipe.topologies[name].router
    return bench.compare or (router.fallback if router is not None else None)


def _target(t: Target) -> RequestTarget:
    return {"name": t.name, "url": t.url, "model": t.model, "key_file": t.key_file, "key_var": t.key_var}


def bench_request(recipe: Recipe, topology: tuple[HostPlan, ...], at: HostPlan, run: str) -> BenchRequest:
    """``hostside/bench_load.py``'s request on the generator host ``at``: no secret, only where
    the keys are on that host."""
    bench = recipe.benchmark
    assert bench is not None
    targets = [local_target(recipe, topology, at)]
    other = hosted(recipe)
    if other is not None:
        targets.append(Target("hosted", other.url.rstrip("/"), other.model, HOSTED_KEY, None))
    engine = _engine(at)
    key_file, key_var = unit_key(recipe, at, engine)
    return {
        "run": run,
        "python": f"{at.engine_dir}/bin/python",
        "tokenizer": at.model_dir,
        # the model's tokenizer is its own code where the recipe trusts it (Kimi's): the
        # generator loads it as the engine does, or every request fails
        "trust_remote_code": recipe.model.trust_remote_code,
        "user": recipe.paths.user,
        "timeout_s": bench.timeout_s,
        "tasks": [
            {"id": t.id, "prompt": t.prompt, "max_tokens": t.max_tokens, "tools": list(t.tools)} for t in bench.tasks
        ],
        "targets": [_target(t) for t in targets],
        "levels": [{"concurrency": c, "rows": rows(bench, c)} for c in bench.concurrency],
        "engine": {
            "unit": engine.name,
            "url": _url(engine, "api", at, at),
            "key_file": key_file,
            "key_var": key_var,
            # the load's peaks of the accelerators' use, read with nvidia-smi
            "nvidia": accelerator(at.accelerator_vendor).device_health,
            "kv_metrics": list(engine_kind(recipe.topologies[at.topology].engine).kv_usage_metrics),
        },
        "remove": [HOSTED_KEY] if other is not None else [],
    }
