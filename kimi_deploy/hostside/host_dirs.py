"""The folders kimi-deploy keeps on every host, named once for the controller and the host programs."""

from __future__ import annotations

# What the deploy records: applied units, releases' log, locks resolved for other hosts, units' state
STATE_DIR = "/var/lib/kimi"
# What host programs append to: drivers, all-reduce checks, weights syncs and scrubs
LOG_DIR = "/var/log/kimi"
# The engines a drain took out of this host's router and did not put back yet (hostside/router_drain.py
# writes it, hostside/state_probe.py reads it)
ROUTER_DRAINED = f"{STATE_DIR}/router-drained.json"
