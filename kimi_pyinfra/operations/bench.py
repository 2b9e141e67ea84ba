"""The serving benchmark's load, run from its generator host (``hostside/bench_load.py``)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation

from kimi_deploy.benchmark.types import BenchRequest
from kimi_deploy.host.programs import BENCH_LOAD
from kimi_pyinfra.operations.units import replaced


@operation()
def loaded(request: BenchRequest, hosted_key: tuple[str, str] | None = None) -> Generator[Any, None, None]:
    """
    Send the benchmark's tasks at each concurrency and record every answer and figure.

    + request: ``kimi_deploy.benchmark.plan.bench_request``'s request (no secret in it)
    + hosted_key: the hosted API's key and the path the host keeps it at while the load runs
      (created empty as root's alone, then filled from standard input: never in argv; renamed
      into place once whole)

    The record is ``/var/lib/kimi/bench.json``; the host fails with one line when the load
    generator cannot run against the deployment's endpoint at all.
    """
    if hosted_key is not None:
        key, path = hosted_key
        # root's alone from the start, and whole or not at all (``operations.units.replaced``)
        yield StringCommand(replaced(path, len(key.encode()), 0o600, "root", "root"), _stdin=key)
    yield BENCH_LOAD.command("python3", request)
