"""The local cluster's fault knobs, as shell commands run on a host: what ``deploys/drill.py``
injects for the drills a real cluster cannot safely be put through (``kimi_drill_faults``, which
``state.json`` carries for the inventories to hand on).

- ``engine-garbage``: the stand-in engine answers every completion with garbage, status 200
  (``/etc/kimi-standin-faults.json``, read by ``standins/kimi_standin/api.py``);
- ``accelerator-lost``: the host's last fake GPU falls off the bus (``lost`` in
  ``/etc/kimi-fake-accelerators.json``, read by ``standins/nvidia_smi.py``: the real tool's lines
  and exit status for it).
"""

from __future__ import annotations

import shlex

_GPUS = "/etc/kimi-fake-accelerators.json"
_STANDIN = "/etc/kimi-standin-faults.json"


def _edit_last_gpu(lost: bool) -> str:
    code = (
        f"import json; p = {_GPUS!r}; d = json.load(open(p)); g = d['gpus'][-1]; "
        + ("g['lost'] = True; " if lost else "g.pop('lost', None); ")
        + "open(p, 'w').write(json.dumps(d))"
    )
    return f"python3 -c {shlex.quote(code)}"


FAULT_KNOBS: dict[str, dict[str, str]] = {
    "engine-garbage": {
        "inject": f"echo '{{\"answer\": \"#@!kjh garbage\"}}' > {_STANDIN}",
        "clear": f"rm -f {_STANDIN}",
    },
    "accelerator-lost": {"inject": _edit_last_gpu(True), "clear": _edit_last_gpu(False)},
}
