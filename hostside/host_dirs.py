"""The folders kimi-deploy keeps on every host, named once for the controller and the host programs."""

from __future__ import annotations

# What the deploy records: applied units, releases' log, locks resolved for other hosts, units' state
STATE_DIR = "/var/lib/kimi"
# What host programs append to: drivers, all-reduce checks, weights syncs and scrubs
LOG_DIR = "/var/log/kimi"
