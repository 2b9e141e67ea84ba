"""Print the context ladder's proofs of every host, changing nothing: ``pyinfra INVENTORY deploys/ladder.py``.

One command per host reads the rungs its engines climbed (``/var/lib/kimi/ladder.json``: each
rung's result, time to first token, decode speed, KV cache and accelerator memory peaks); after
the last host, the whole table is printed and written as JSON to ``kimi-ladder.json`` (or the
path in host data ``kimi_ladder_json``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from kimi_deploy.errors import ConfigError
from kimi_deploy.inventory import make_host
from kimi_deploy.serving.ladder_table import format_proofs
from kimi_pyinfra.facts.ladder import LadderProofs
from kimi_pyinfra.host_plan import inventory_label
from kimi_pyinfra.run_context import in_run, run_context


@in_run
@pyinfra_deploy("ladder")
def deploy_ladder() -> None:
    """Print the context ladder's proofs of every host, changing nothing: ``pyinfra INVENTORY deploys/ladder.py``."""
    # The host's data as every deploy reads it: checked against the inventory schema (one line on a fault).
    try:
        me = make_host(inventory_label(), host.name, tuple(host.groups), host.data.dict()).vars  # type: ignore[no-untyped-call]
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None

    # pyinfra runs this file once per host, concurrently and with fresh globals: what was read so far
    # lives in the run's context.
    _proofs = run_context().ladders
    _proofs[host.name] = host.get_fact(LadderProofs)

    active = set(inventory.iter_activated_hosts())
    hosts = [h.name for h in inventory if h in active]
    # Whichever host answers last prints the whole table.
    if all(name in _proofs for name in hosts):
        ordered = {name: _proofs[name] for name in hosts}
        logger.info("\n" + format_proofs(ordered))
        target = Path(me.kimi_ladder_json or "kimi-ladder.json")
        target.write_text(json.dumps(ordered, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        logger.info(f"--> Wrote {target} ({len(ordered)} hosts)")
