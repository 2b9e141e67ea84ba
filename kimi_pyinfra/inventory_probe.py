"""Probe every host of the run at once: one round-trip per host, all hosts in parallel.

pyinfra prepares a deploy file for every host at the same time (one greenlet per host), and each
host's deploy sees only its own facts. Decisions that span hosts (who fetches weights from whom)
need every host's state before any host queues its operations. So the first host's deploy to ask
probes every active host of the run in parallel (pyinfra's fact pool and connections); the
others wait for that one probe and read their own result from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra.api.facts import FactBase
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.context import ctx_host, ctx_state

from kimi_deploy.host.command import NotKept
from kimi_pyinfra.facts.host_state import KimiHostState
from kimi_pyinfra.run_context import Probe, run_context


def active_hosts(state: State) -> list[Host]:
    """The hosts of this run, in inventory order."""
    return [h for h in state.inventory if h in state.active_hosts]


def probe_all(
    state: State, request_of: Callable[[Host], dict[str, Any]], fact: type[FactBase[Any]] = KimiHostState
) -> dict[str, Any]:
    """Every active host's ``fact`` (called with ``request_of(host)`` as its arguments), or the
    exception its probe raised; probed once per run, all hosts in parallel."""
    run = ctx_state.get() or state  # type: ignore[no-untyped-call]  # the run's State, not a proxy
    with ctx_state.use(run):
        probes = run_context().probes
    key = _key(fact)
    if key in probes:
        probes[key].done.wait()
        return probes[key].results
    probe = probes[key] = Probe()
    results = probe.results

    def one(host: Host) -> Any:
        with ctx_state.use(run), ctx_host.use(host):
            try:
                return fetched(host, fact, request_of(host))
            except Exception as exc:  # noqa: BLE001 - raised again in that host's own deploy
                return exc

    try:
        # The fact pool, not the pool running the deploy files: those may all be waiting here.
        greenlets = {host.name: run.fact_pool.spawn(one, host) for host in active_hosts(run)}
        results.update({name: greenlet.get() for name, greenlet in greenlets.items()})
    finally:
        probe.done.set()
    return results


def fetched(host: Host, fact: type[FactBase[Any]], arguments: dict[str, Any]) -> Any:
    """``host``'s ``fact``; a probe that names the host's kept copy of its program (``NotKept``:
    the first run of this version on the host) is sent again with the program."""
    try:
        return host.get_fact(fact, **arguments)
    except NotKept:
        return host.get_fact(fact, **{**arguments, "kept": False})


def answered(host: Host, fact: type[FactBase[Any]] = KimiHostState) -> Any | None:
    """``host``'s answer to ``fact`` if this run has probed every host for it; None when it has not,
    or when that host's probe failed."""
    probe = run_context().probes.get(_key(fact))
    result = probe.results.get(host.name) if probe is not None else None
    return None if isinstance(result, BaseException) else result


def _key(fact: type[FactBase[Any]]) -> str:
    return f"{fact.__module__}.{fact.__name__}"


def probe_of(
    state: State, host: Host, request_of: Callable[[Host], dict[str, Any]], fact: type[FactBase[Any]] = KimiHostState
) -> Any:
    """``host``'s probe result; its probe's exception is raised here, in its own deploy."""
    results = probe_all(state, request_of, fact)
    if host.name not in results:  # activated after the others were probed
        results[host.name] = fetched(host, fact, request_of(host))
    result = results[host.name]
    if isinstance(result, BaseException):
        raise result
    return result
