"""Every host of a run at once.

pyinfra runs each operation's hosts in batches of ``config.PARALLEL`` (the default of every
operation's ``_parallel``), in a pool of greenlets as large; unless ``--parallel`` says otherwise
that is 20 per controller CPU (``pyinfra.api.state.State``: 40 on a 2-core controller) and the
number of hosts at most. An operation whose hosts wait on one another deadlocks when
some of them wait for a slot: in the weights step every host of a chain relays each file to the
next while it receives it, so a host left out of the pool stalls every host after it. A run
therefore widens both pools (the operations' and the facts', which the host probe uses) to all
its hosts, within pyinfra's own bound for the open-files limit, and says so in one line. With an
explicit ``--parallel`` (or ``PYINFRA_PARALLEL``) the operator's choice stands: a chain's host
whose upstream has not started yet waits for it ``hostside/weights_peer.PENDING_S`` at most,
then takes its files from the hosts before it or the chain's source.
"""

from __future__ import annotations

import logging
import os
import sys

from gevent.pool import Pool  # type: ignore[import-untyped]
from pyinfra.api.state import MAX_PARALLEL, State
from pyinfra.context import ctx_config

logger = logging.getLogger("pyinfra")


def chosen_by_operator(argv: list[str], environ: dict[str, str]) -> bool:
    return any(a == "--parallel" or a.startswith("--parallel=") for a in argv) or bool(environ.get("PYINFRA_PARALLEL"))


def widen_pools(state: State) -> int | None:
    """Resize ``state``'s pools to every host of the inventory; the new size, or None when the
    pools hold them all already or the operator chose their size."""
    inventory, pool = getattr(state, "inventory", None), getattr(state, "pool", None)
    if inventory is None or pool is None or pool.size is None:
        return None  # a state made for planning, running nothing
    size = min(len(inventory), MAX_PARALLEL)
    if size <= pool.size or chosen_by_operator(sys.argv, dict(os.environ)):
        return None
    state.pool = Pool(size)
    state.fact_pool = Pool(size)
    # Each operation's ``_parallel`` defaults to this, and batches the hosts by it (see ``aligned``).
    state.config.PARALLEL = size
    logger.info(f"--> Every host at once: {size} parallel (pyinfra's default here is {pool.size})")
    return size


def aligned(state: State) -> None:
    """Give this host's deploy-file context the run's ``PARALLEL``: pyinfra loads each host's
    deploy file with a copy of the config taken when that host's load began, which may be before
    the run widened it; operations read the copy, and must agree across hosts."""
    config = getattr(state, "config", None)
    if config is not None and ctx_config.isset():  # type: ignore[no-untyped-call]
        ctx_config.get().PARALLEL = config.PARALLEL  # type: ignore[no-untyped-call]
