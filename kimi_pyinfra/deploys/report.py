"""Report the hardware of every host, changing nothing: ``pyinfra INVENTORY deploys/report.py``.

One probe round-trip per host (``hostside/hardware_probe.py``, with a bounded read-throughput
measurement of the weights filesystem). After the last host, prints the inventory-wide table and
writes the same as JSON to ``kimi-report.json`` (or the path in host data ``kimi_report_json``).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra import logger
from pyinfra.api.deploy import deploy as pyinfra_deploy
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import host, inventory

from kimi_deploy.errors import ConfigError
from kimi_deploy.host.report_table import format_report
from kimi_deploy.inventory import make_host
from kimi_pyinfra.facts.hardware import HostHardware
from kimi_pyinfra.host_plan import inventory_label
from kimi_pyinfra.run_context import in_run, run_context


@in_run
@pyinfra_deploy("report")
def deploy_report() -> None:
    """Report the hardware of every host, changing nothing: ``pyinfra INVENTORY deploys/report.py``."""
    # pyinfra runs this file once per host, concurrently and with fresh globals: the profiles
    # gathered so far live in the run's context.
    _profiles = run_context().profiles

    # The host's data as every deploy reads it: checked against the inventory schema (one line on a fault).
    try:
        me = make_host(inventory_label(), host.name, tuple(host.groups), host.data.dict()).vars  # type: ignore[no-untyped-call]
    except ConfigError as exc:
        raise PyinfraError(str(exc)) from None
    models = me.kimi_models_dir or "/srv/models"
    _profiles[host.name] = host.get_fact(HostHardware, request={"weights_dir": models, "measure": True})

    active = set(inventory.iter_activated_hosts())
    hosts = [h.name for h in inventory if h in active]
    # Whichever host finishes its probe last prints the whole table.
    if all(name in _profiles for name in hosts):
        ordered = {name: _profiles[name] for name in hosts if name in _profiles}
        logger.info("\n" + format_report(ordered))
        target = Path(me.kimi_report_json or "kimi-report.json")
        target.write_text(json.dumps(ordered, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        logger.info(f"--> Wrote {target} ({len(ordered)} hosts)")
