"""What a converge repairs on a host it converged before: what a hand, a tool or a failing disk
changed since, named one line each (``deploys/kimi.py`` prints them before it repairs them).

From the host's probe: every file the deploy writes (its release's record and copies included)
whose owner or mode is not the plan's (put back alone, its content untouched), or that is absent
or whose content differs while the release the plan makes is the one serving (written again; a
file that differs because the plan changed, an upgrade, is not drift); weights the engine user
cannot read (their modes, or a folder's, given back by the sync); a unit running with files
written since it started, or whose unit file systemd has not loaded since it changed
(restarted). A host the deploy never converged (no ``current`` release) has nothing to repair:
everything is new.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_deploy.converge.plan import Converge
from kimi_deploy.host.profile_types import HostState
from kimi_deploy.render.files import RenderedFile


def drift(todo: Converge, found: HostState, files: Sequence[RenderedFile]) -> list[str]:
    """One line per thing ``found`` holds that is not as the deploy left it; empty on a new host."""
    if found["current"] is None:
        return []
    serving = found["current"] == todo.release.dir
    lines = []
    for f in files:
        if not serving and f.path.startswith(todo.release.dir + "/"):
            continue  # a release not serving yet: the converge writes its folder whole
        sha, owner = found["files"].get(f.path), found["owners"].get(f.path)
        if sha is None:
            if serving:
                lines.append(f"{f.path}: absent: written again")
            continue
        if serving and sha != f.sha256:
            lines.append(f"{f.path}: content differs from the release serving: written again")
        wanted = f.owner_mode(todo.user)
        if owner != wanted:
            lines.append(f"{f.path}: owner and mode {owner}, not {wanted}: put back")
    for checkpoint in todo.checkpoints:
        weights = found["weights"].get(checkpoint.path)
        if weights is None or not weights["exists"] or not weights.get("unreadable"):
            continue
        bad = weights["unreadable"]
        what = "weights" if checkpoint.link == "model" else f"{checkpoint.link} weights"
        lines.append(
            f"{what}: {len(bad)} files the engine user {todo.user} cannot read ({bad[0]}"
            f"{', ...' if len(bad) > 1 else ''}): checked and given their modes back"
        )
    for unit in todo.units:
        current = found["units"].get(unit.name)
        if current is None or current.get("applied") != unit.release or not current.get("files_changed"):
            continue
        why = (
            "systemd has not loaded its unit file since it changed"
            if current.get("needs_reload")
            else ("a file it reads was written after it started")
        )
        lines.append(f"{unit.name}: {why}: restarted with its files")
    return lines
