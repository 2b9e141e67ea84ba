"""The watchdog of an engine host: a service that checks its engines between converges.

Pure: returns the files to render (the program, its config and its unit) from the host's units
as the converge plans them. The program (``hostside/watchdog.py``) checks each engine with the
same request the converge's smoke test sends, reads the accelerators the topology gives the host
and the scrub's result, and walks the recipe's ``watchdog`` ladder. Its state goes to
``/var/lib/kimi/watchdog.json`` (the next converge's probe reads it, ``kimi_deploy.serving.watchdog_report``
tells it), its metrics to the node exporter's textfile collector.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kimi_deploy.accelerators import accelerator
from kimi_deploy.host.programs import WATCHDOG
from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.hostside.requests import UnitAsk, WatchdogConfig
from kimi_deploy.plan.servespec import HostPlan
from kimi_deploy.recipe import Recipe, Watchdog
from kimi_deploy.render.files import UNIT_DIR, RenderedFile, environment

WATCHDOG_UNIT = "kimi-watchdog"
STATE_FILE = f"{STATE_DIR}/watchdog.json"
TEXTFILE = "kimi_watchdog.prom"


def watchdog_config(
    recipe: Recipe,
    watchdog: Watchdog,
    spec: HostPlan,
    checks: Sequence[tuple[str, str | None, UnitAsk]],
    scrub: str | None,
) -> WatchdogConfig:
    """The program's config: ``checks`` are (unit, URL of its API or None, its smoke request)."""
    return {
        "interval_s": watchdog.interval_s,
        "timeout_s": watchdog.timeout_s,
        "canary_interval_s": watchdog.canary_interval_s,
        "canary_timeout_s": watchdog.canary_timeout_s,
        "restart_after": watchdog.restart_after,
        "restarts": watchdog.restarts,
        "grace_s": watchdog.grace_s or recipe.smoke.timeout_s,
        "state": STATE_FILE,
        "textfile": f"{watchdog.textfile_dir}/{TEXTFILE}",
        "units": [
            {
                "unit": unit,
                "url": url,
                "reads_weights": True,
                "served_name": ask["served_name"],
                "prompt": ask["prompt"],
                "expect": ask["expect"],
                "max_tokens": ask["max_tokens"],
                "key_file": ask["key_file"],
                "key_var": ask["key_var"],
            }
            for unit, url, ask in checks
        ],
        # The GPUs the plan gives the host, and the kernel's log where the driver reports their
        # faults (Xid events), for a kind whose health the watchdog reads (a TPU host's chips have
        # no reader here yet).
        **accelerator(spec.accelerator_vendor).watchdog(spec),
        "scrub": scrub,
        "xid_ignore": sorted(watchdog.xid_ignore),
    }


def watchdog_files(
    watchdog: Watchdog, config: WatchdogConfig, *, config_dir: str, tools_dir: str, python: str
) -> list[RenderedFile]:
    """The watchdog's program, config and unit for a host."""
    script = f"{tools_dir}/{WATCHDOG_UNIT}.py"
    config_file = f"{config_dir}/{WATCHDOG_UNIT}.json"
    service = f"{UNIT_DIR}/{WATCHDOG_UNIT}.service"
    units = [u["unit"] for u in config["units"]]
    text = (
        environment()
        .get_template("watchdog.service.j2")
        .render(
            path=service,
            units=units,
            after=" ".join(f"{u}.service" for u in units),
            python=python,
            script=script,
            config=config_file,
            textfile_dir=watchdog.textfile_dir,
            # systemd restarts a watchdog silent for three rounds and a slow check (sd_notify WATCHDOG=1)
            watchdog_s=3 * watchdog.interval_s + watchdog.timeout_s * (len(units) + 1) + 30,
            nvidia=config["accelerators"] is not None,
        )
    )
    return [
        RenderedFile(script, WATCHDOG.source(), 0o644, "root"),
        RenderedFile(config_file, json.dumps(config, sort_keys=True, indent=1) + "\n", 0o644, "root"),
        RenderedFile(service, text, 0o644, "root"),
    ]
