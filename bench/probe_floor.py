"""The floor of a converge's no-op: connect to every host and read the one fact it decides on
(``facts.host_state.KimiHostState``, with the request ``deploys/kimi.py`` sends), change nothing.

Between ``bench/floor.py`` (one cheap fact) and the no-op (this fact, then the steps rehearsed
from it), it tells the probe's own cost from what the deploy adds to it (``bench/fleet.py``).
"""

from __future__ import annotations

from pyinfra.context import host

from kimi_pyinfra.converge_run import probe_request
from kimi_pyinfra.facts.host_state import KimiHostState
from kimi_pyinfra.inventory_probe import fetched

fetched(host, KimiHostState, probe_request(host))
