"""Benchmark the served endpoint as clients use it: ``pyinfra INVENTORY deploys/bench.py -y``.

The recipe's ``benchmark`` tasks go through the benchmarked topology's client endpoint (its
gateway and router, or its engine) at each concurrency, sent by ``vllm bench serve`` of the
pinned vLLM release from the topology's first engine host, and, where a hosted API is compared
(``benchmark.compare``, or the topology's router fallback), the same tasks against it. Every
answer is judged by its task's acceptance rule. After the load, the controller prints the table
(TTFT p50/p95, inter-token latency, output tokens/s, success rate, errors, KV cache and
accelerator memory peaks, the generator's CPU against the engine's, cost per successful task) and
writes it as JSON to ``kimi-bench.json`` and as a picture to ``kimi-bench.png`` (or the paths in
host data ``kimi_bench_json`` and ``kimi_bench_png``). The run's figures go into the serving
release's record on the generator host (``bench.json`` in its folder); where the release serving
has changed since a run (an upgrade by pin, a rollback), the figures are printed against that
release's. Changes nothing that serves.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory
from pyinfra.operations import python

from kimi_deploy.benchmark.delta import figures, format_delta
from kimi_deploy.benchmark.plan import HOSTED_KEY, bench_request, bench_topology, generator, hosted, local_target
from kimi_deploy.benchmark.report import format_report, report
from kimi_deploy.benchmark.types import BenchRecordRequest, Report, ReportMeta
from kimi_deploy.errors import ConfigError
from kimi_deploy.extras import MissingExtra
from kimi_deploy.host.command import ANSWER_MAX_BYTES
from kimi_deploy.host.programs import BENCH_RECORD
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.secrets import read_secret
from kimi_pyinfra.facts.bench import BenchRecord
from kimi_pyinfra.host_plan import plan_for
from kimi_pyinfra.operations import bench
from kimi_pyinfra.run_context import in_run, run_context


@in_run
@pyinfra_deploy("bench")
def deploy_bench() -> None:
    """Benchmark the served endpoint as clients use it: ``pyinfra INVENTORY deploys/bench.py -y``."""
    try:
        deploy = plan_for(inventory, host)
        recipe = deploy.recipe
        if recipe.benchmark is None:
            raise ConfigError(
                deploy.recipe_file, "benchmark", "the recipe has no benchmark (its tasks and concurrencies)"
            )
        name = bench_topology(recipe)
        at = generator(deploy.topology) if deploy.spec.topology == name else None
        if at is not None and at.host == host.name:
            request = bench_request(recipe, deploy.topology, at, run_context().run_id)
            other = hosted(recipe)
            hosted_key = None
            if other is not None:
                field = (
                    "benchmark.compare.api_key"
                    if recipe.benchmark.compare
                    else f"topologies.{name}.router.fallback.api_key"
                )
                hosted_key = (read_secret(other.api_key, deploy.recipe_file, field, run_context().environ), HOSTED_KEY)
            endpoint = local_target(recipe, deploy.topology, at).url
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None

    def _record(rep: Report) -> dict[str, object]:
        """Put the run's figures in the serving release's record on the generator host; what it
        answers: the release's name and the latest run of another release (``hostside/bench_record.py``)."""
        request: BenchRecordRequest = {
            "figures": figures(rep),
            "current": recipe.paths.current,
            "releases": recipe.paths.releases,
        }
        ok, output = host.run_shell_command(BENCH_RECORD.command("python3", request))
        if not ok:
            raise PyinfraError(f"{host.name}: benchmark: the release record was not written: {output.stderr[-300:]}")
        # A host's answer: outside the recipe, read through the boundary's bounds.
        answer = loads(output.stdout, "benchmark release record", max_bytes=ANSWER_MAX_BYTES)
        return answer if isinstance(answer, dict) else {}

    def _report() -> None:
        """Judge what the generator host recorded; print, write and draw the report, and put its
        figures in the serving release's record, with the difference from the release it replaced."""
        assert recipe.benchmark is not None
        found = host.get_fact(BenchRecord)
        meta: ReportMeta = {
            "topology": name,
            "endpoint": endpoint,
            "generator": host.name,
            "recipe": deploy.recipe_file,
        }
        rep = report(recipe.benchmark, found, deploy.topology, meta)
        logger.info("\n" + format_report(rep))
        recorded = _record(rep)
        rep |= {"release": recorded.get("release"), "before": recorded.get("before")}
        delta = format_delta(figures(rep), recorded.get("before"), recorded.get("release"))
        if delta:
            logger.info("\n" + "\n".join(delta))
        target = Path(deploy.host.vars.kimi_bench_json or "kimi-bench.json")
        target.write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        picture = Path(deploy.host.vars.kimi_bench_png or "kimi-bench.png")
        try:
            from kimi_deploy.benchmark.plot import draw  # noqa: PLC0415 - matplotlib: the extra kimi-deploy[plot]
        except MissingExtra as exc:
            logger.warning(f"--> Wrote {target}; no picture: {exc}")
            return
        draw(rep, picture)
        logger.info(f"--> Wrote {target} and {picture}")

    if at is not None and at.host == host.name:
        bench.loaded(name="Serving benchmark", request=request, hosted_key=hosted_key)
        python.call(name="Benchmark report", function=_report)
