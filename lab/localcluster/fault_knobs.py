"""The local cluster's fault knobs, as shell commands run on a host: what ``deploys/drill.py``
injects for the drills a real cluster cannot safely be put through (``kimi_drill_faults``, which
``state.json`` carries for the inventories to hand on).

- ``engine-garbage``: the stand-in engine answers every completion with garbage, status 200
  (``/etc/kimi-standin-faults.json``, read by ``standins/kimi_standin/api.py``);
- ``accelerator-lost``: the host's last fake GPU falls off the bus (``lost`` in
  ``/etc/kimi-fake-accelerators.json``, read by ``standins/nvidia_smi.py``: the real tool's lines
  and exit status for it), and the driver's Xid 79 for it in the kernel's log;
- ``host-down``: the host loses its link and powers off a second later (a timer, so that the
  drill's SSH session ends first): to the others, a host that stopped answering mid-request, as
  one whose power failed. No clear on the host: ``kimi-deploy cluster up`` boots it again, with
  the disk it had;
- ``fabric-refused``: the NVLink fabric refuses the host's last GPU: ``fabric.state`` Completed,
  ``fabric.status`` Insufficient Resources, as an Azure Grace Blackwell VM printed it
  (Azure/azhpc-images#506);
- ``accelerator-xid``: the driver logs an Xid 119 (its GSP firmware stopped answering) for the
  host's last GPU, which still answers nvidia-smi: a fault the kernel's log alone tells.

The kernel's log: systemd-nspawn gives a host no ``/dev/kmsg`` (its journal would read the
controller's kernel), so the knob writes the record there itself, a file in the host's own
``/dev`` in the kernel's record format (``<prio>,<seq>,<usec>,-;<message>``, Linux's
Documentation/ABI/testing/dev-kmsg), at priority 3 (kernel, error), its clock CLOCK_MONOTONIC as
the kernel's; the messages are the real driver's (tests/fixtures/xid: xid_02 for 79, xid_03 for
119).
"""

from __future__ import annotations

import shlex

_GPUS = "/etc/kimi-fake-accelerators.json"
_STANDIN = "/etc/kimi-standin-faults.json"


def _edit_last_gpu(key: str, value: object) -> str:
    """Set ``key`` of the host's last fake GPU to ``value`` (None: remove it)."""
    change = f"g.pop({key!r}, None); " if value is None else f"g[{key!r}] = {value!r}; "
    code = (
        f"import json; p = {_GPUS!r}; d = json.load(open(p)); g = d['gpus'][-1]; {change}"
        "open(p, 'w').write(json.dumps(d))"
    )
    return f"python3 -c {shlex.quote(code)}"


def _log_xid(code: int, message: str) -> str:
    code_text = (
        f"import json, os, time; g = json.load(open({_GPUS!r}))['gpus'][-1]; d, b, rest = "
        "g['pci_bus_id'].lower().split(':'); bus = d[-4:] + ':' + b + ':' + rest.split('.')[0]; "
        "seq = sum(1 for _ in open('/dev/kmsg')) if os.path.isfile('/dev/kmsg') else 0; "
        f"line = '3,%d,%d,-;NVRM: Xid (PCI:%s): {code}, %s' % (seq + 1, time.monotonic() * 1e6, bus, "
        f"{message!r}.replace('GPU#', 'GPU%d' % g['index'])); "
        "open('/dev/kmsg', 'a').write(line + chr(10))"
    )
    return f"python3 -c {shlex.quote(code_text)}"


_POWER_FAILS = "ip link set eth0 down; systemctl poweroff"
FALLEN = "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
GSP_TIMEOUT = (
    "pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU# GSP! "
    "Expected function 76 (GSP_RM_CONTROL) (0x20801813 0x4c)."
)

FAULT_KNOBS: dict[str, dict[str, str]] = {
    "engine-garbage": {
        "inject": f'echo \'{{"answer": "#@!kjh garbage"}}\' > {_STANDIN}',
        "clear": f"rm -f {_STANDIN}",
    },
    "accelerator-lost": {
        "inject": f"{_edit_last_gpu('lost', True)} && {_log_xid(79, FALLEN)}",
        "clear": _edit_last_gpu("lost", None),
    },
    # the NVLink fabric refuses the last GPU (state Completed, status Insufficient Resources)
    "fabric-refused": {
        "inject": _edit_last_gpu("fabric_status", "Insufficient Resources"),
        "clear": _edit_last_gpu("fabric_status", None),
    },
    "host-down": {"inject": f"systemd-run --quiet --collect --on-active=2 sh -c {shlex.quote(_POWER_FAILS)}"},
    # an event: nothing to clear (the engine started again after it is judged afresh)
    "accelerator-xid": {"inject": _log_xid(119, GSP_TIMEOUT)},
}
