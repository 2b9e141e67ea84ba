"""The context ladder climbed on a host: its engine restarted at each rung, probed, recorded."""

from __future__ import annotations

from collections.abc import Generator

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.host.programs import LADDER
from kimi_deploy.hostside.requests import LadderRequest


@operation()
def climbed(request: LadderRequest | None) -> Generator[str, None, None]:
    """
    Climb the rungs of ``request`` (``kimi_deploy.serving.context_ladder.climb_request``) one at a time.

    + request: ``hostside/ladder.py``'s request, or None where this host climbs nothing in this step

    The first rung that fails stops the climb: the host fails with one line naming the rung and
    the engine's reason, and the highest rung that passed (or the one that served before) serves.
    """
    if request is None:
        host.noop("no rung of the context ladder to climb in this step")
        return
    yield LADDER.command("python3", request)
