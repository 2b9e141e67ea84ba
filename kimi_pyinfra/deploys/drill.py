"""Fault drills: ``pyinfra INVENTORY deploys/drill.py -y --data kimi_drill=NAME --limit HOST``.

Injects one fault on each host it runs on (``--limit`` picks them) and changes nothing else, for
what serves to meet it: systemd, the watchdog (``kimi-watchdog``), the router, the gateway's
hosted fallback, the weights scrub. The drills and what each injects are in ``kimi_deploy.converge.drills``:
``engine-killed``, ``engine-stopped``, ``shard-corrupted`` and ``link-cut`` (``--data
kimi_drill_peer=HOST``, healed after ``kimi_drill_for_s`` seconds) are safe on a production cluster;
others come from the inventory's ``kimi_drill_faults``; ``clear`` undoes them (and starts the
engines again). Each host prints ``drill: NAME injected at <UTC time>`` once it is. A client load and the
figures (time to detect, to recover, failed requests) are ``bench/drills.py``'s.
"""

from __future__ import annotations

import datetime

from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory
from pyinfra.operations import python, server

from kimi_deploy.converge.drills import DrillError, drill_commands
from kimi_deploy.errors import ConfigError
from kimi_pyinfra.host_plan import todo_for
from kimi_pyinfra.run_context import in_run


@in_run
@pyinfra_deploy("drill")
def deploy_drill() -> None:
    """Fault drills: ``pyinfra INVENTORY deploys/drill.py -y --data kimi_drill=NAME --limit HOST``."""
    try:
        deploy, todo = todo_for(inventory, host)
        drill = deploy.host.vars.kimi_drill
        if drill is None:
            raise ConfigError(deploy.recipe_file, "kimi_drill", "no drill named: --data kimi_drill=NAME")
        engines = [u.name for u in deploy.spec.units if u.kind == "engine"]
        peer = deploy.host.vars.kimi_drill_peer
        address = None
        if peer is not None:
            others = {h.host: h.address for h in deploy.topology if h.host != host.name}
            if peer not in others:
                known = ", ".join(others) or "none"
                raise DrillError(f"kimi_drill_peer: no host {peer!r} in this host's topology (it has {known})")
            address = others[peer]
        commands = drill_commands(
            drill,
            todo,
            engines,
            deploy.host.vars.kimi_drill_faults or {},
            peer=address,
            for_s=deploy.host.vars.kimi_drill_for_s,
        )
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None
    except DrillError as exc:
        raise PyinfraError(f"{host.name}: {exc}") from None

    def _said() -> None:
        at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        host.log(f"drill: {drill} {'done' if drill == 'clear' else 'injected'} at {at}")

    server.shell(name=f"Drill: {drill}", commands=commands)
    python.call(name=f"Drill: {drill} (time)", function=_said)
