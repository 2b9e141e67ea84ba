"""The weights scrub: a systemd timer that re-hashes a host's revision against its lock.

Pure: returns the files to render (the service, its timer, the request it runs and the program).
The service runs the same host-side program as a sync, in scrub mode, at idle CPU and I/O
priority: every file is hashed again whatever the cache says; a corrupted file is named in the
journal and in ``.kimi/scrub.json`` beside the weights, and re-fetched from the Hub when the
recipe says ``repair``. It fails (``systemctl --failed`` shows it) when corruption stays.
"""

from __future__ import annotations

import json

from kimi_deploy.host.programs import WEIGHTS_SYNC
from kimi_deploy.hostside.host_dirs import LOG_DIR
from kimi_deploy.hostside.requests import SyncRequest
from kimi_deploy.recipe import Scrub
from kimi_deploy.render.files import UNIT_DIR, RenderedFile, environment

SCRUB_UNIT = "kimi-weights-scrub"
PROGRESS_LOG = f"{LOG_DIR}/weights.log"


def scrub_files(
    scrub: Scrub, *, config_dir: str, tools_dir: str, python: str, request: SyncRequest, withheld: str = ""
) -> list[RenderedFile]:
    """The scrub's files for a host holding the revision ``request`` names (a sync request);
    ``withheld``: why the request's lock is a stand-in, said by the file holding it."""
    jinja = environment()
    script = f"{tools_dir}/kimi-weights-sync.py"
    config = f"{config_dir}/{SCRUB_UNIT}.json"
    service = f"{UNIT_DIR}/{SCRUB_UNIT}.service"
    timer = f"{UNIT_DIR}/{SCRUB_UNIT}.timer"
    body: SyncRequest = {**request, "scrub": True, "repair": scrub.repair, "peers": [], "full": True}
    return [
        RenderedFile(script, WEIGHTS_SYNC.source(), 0o644, "root"),
        RenderedFile(config, json.dumps(body, sort_keys=True, indent=1) + "\n", 0o644, "root", withheld=withheld),
        RenderedFile(
            service,
            jinja.get_template("weights-scrub.service.j2").render(
                path=service,
                repo=request["repo"],
                revision=request["revision"],
                repair=scrub.repair,
                dir=request["dir"],
                python=python,
                script=script,
                config=config,
            ),
            0o644,
            "root",
        ),
        RenderedFile(
            timer,
            jinja.get_template("weights-scrub.timer.j2").render(path=timer, schedule=scrub.schedule),
            0o644,
            "root",
        ),
    ]
