"""A converge's cold start put in the record of the release it left serving on the host.

Request (JSON, zlib, base64 in argv): ``{"seconds": {phase: s}, "to_serving": s, "run": RUN_ID,
"current": "/opt/kimi/current", "releases": "/opt/kimi/releases", "engines": [{"unit", "phases",
"ready"}]}``: how long each phase of the host's converge took (``kimi_deploy.converge.cold_start``),
timed by the controller, and the engine units whose last start is read in their own words
(``hostside.start_phases``: loading, compiling, ready). The release
serving is where ``current`` points, kept inside ``releases`` (``bench_record.serving_release``);
its folder gets ``cold-start.json`` (``{"release", "at", "run", "seconds", "to_serving",
"engine": {unit: {phase: s}}}``), beside the benchmark's ``bench.json``, for ``kimi-deploy
status``. Prints ``{"release": NAME, "engine": {unit: {phase: s}}}`` (release None: ``current``
points at no release, and nothing is written).
"""

from __future__ import annotations

import json
import os
import time

from kimi_deploy.hostside.bench_record import serving_release
from kimi_deploy.hostside.request import read_request
from kimi_deploy.hostside.start_phases import phases
from kimi_deploy.hostside.whole_file import write_whole

TYPE_CHECKING = False  # for type checkers only: a host imports no more than it runs
if TYPE_CHECKING:
    from kimi_deploy.hostside.requests import ColdStartRecordRequest

RECORD = "cold-start.json"


def record(req: ColdStartRecordRequest) -> dict[str, object]:
    engine = {e["unit"]: phases(e["unit"], e["phases"], e["ready"]) for e in req.get("engines", [])}
    folder = serving_release(req["current"], req["releases"])
    if folder is None:
        return {"release": None, "engine": engine}
    name = os.path.basename(folder)
    entry = {
        "release": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": req["run"],
        "seconds": req["seconds"],
        "to_serving": req["to_serving"],
        "engine": engine,
    }
    write_whole(os.path.join(folder, RECORD), json.dumps(entry, sort_keys=True) + "\n", 0o644)
    return {"release": name, "engine": engine}


def main() -> None:
    print(json.dumps(record(read_request()), sort_keys=True))


if __name__ == "__main__":
    main()
