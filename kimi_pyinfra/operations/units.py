"""Rendered files (units, environment, configs, secrets) and the services that read them."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Mapping

from pyinfra.api.command import StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.converge.plan import needs_start
from kimi_deploy.hostside.probe_types import TimerState, UnitState
from kimi_deploy.hostside.state_probe import APPLIED
from kimi_deploy.render.files import RenderedFile

# The suffix of the new file ``replaced`` fills beside the one it replaces.
NEW_SUFFIX = ".kimi-new"


@operation()
def rendered(
    files: list[RenderedFile], group: str, current: Mapping[str, str | None], owners: Mapping[str, str | None]
) -> Generator[StringCommand | str, None, None]:
    """
    Put every rendered file in place with its mode and owner; reload systemd if a unit changed.

    + files: the host's rendered files (``kimi_deploy.render.files.render_host``)
    + group: the engine user's group, which may read a secret file whose mode lets its group read
      it (the weights transfer key); every other file, secret or not, is root's
    + current: sha256 of each file on the host as the probe found it (None: absent)
    + owners: ``owner:group:octal mode`` of each file on the host as the probe found it: a file
      whose content is right but not its owner or mode gets them back alone (its content, and so
      its time, untouched: what a unit read did not change)

    A file's content travels on the standard input of the one command that writes it, never
    through a file elsewhere on the host: with a sudo SSH user, pyinfra's upload would stage it
    as that user in the temporary directory, readable there by others.

    That command (``replaced``) fills a new file beside the old one, ``<path>.kimi-new``, created
    empty with the file's final owner, group and mode (a secret is never readable by anyone else,
    even briefly), checks that all of the content arrived, and only then renames it over the file:
    a controller killed while the content streams (its SSH session cut) leaves the previous file
    whole, never a half-written one, and a unit started after sees one file or the other. The
    rename is atomic in one folder; systemd, nginx's includes and our own globs ignore the suffix,
    and the next run overwrites a ``.kimi-new`` one left behind.
    """
    changed = [f for f in files if current.get(f.path) != f.sha256]
    q = shlex.quote
    owned = [f for f in files if f not in changed and owners.get(f.path) != f.owner_mode(group)]
    if owned:
        yield " && ".join(
            f"chown {q(f.owner)}:{q(f.group(group))} {q(f.path)} && chmod {f.mode:o} {q(f.path)}" for f in owned
        )
    if not changed:
        if not owned:
            host.noop(f"{len(files)} rendered files are up to date")
        return

    # The folders first. The secrets folder lets the engine group through to the one secret it
    # reads (see ``group``).
    folders = {f.path.rsplit("/", 1)[0]: f.secret for f in changed}
    yield " && ".join(
        f"install -d -m {'0750' if secret else '0755'} -o root -g {q(group if secret else 'root')} {q(folder)}"
        for folder, secret in sorted(folders.items())
    )
    for f in changed:
        yield StringCommand(
            replaced(f.path, len(f.content.encode()), f.mode, f.owner, f.group(group)), _stdin=f.content
        )
    # The renamed files have their owner and mode already: systemd is told when a unit changed.
    if any(f.path.endswith((".service", ".timer")) for f in changed):
        yield "systemctl daemon-reload"


def replaced(path: str, size: int, mode: int, owner: str, group: str) -> str:
    """
    The one command that replaces ``path`` by the ``size`` bytes of its standard input, with
    ``mode``, ``owner`` and ``group``, whole or not at all: the content fills ``<path>.kimi-new``,
    created empty with them first, which is renamed over ``path`` once its size is ``size``. A
    command cut short (its standard input ended early) fails and leaves ``path`` as it was.
    """
    q = shlex.quote
    new = q(path + NEW_SUFFIX)
    return " && ".join(
        [
            f"install -m {mode:o} -o {q(owner)} -g {q(group)} /dev/null {new}",
            # pyinfra ends its standard input with a newline: ``head`` takes exactly the content.
            f"head -c {size} > {new}",
            f'test "$(stat -c %s {new})" = {size}',
            f"mv -f {new} {q(path)}",
        ]
    )


@operation()
def started(units: list[tuple[str, str, UnitState | None]]) -> Generator[str, None, None]:
    """
    Keep each unit enabled and running its release, (re)starting only those that changed.

    + units: ``(unit, release, current)`` for each unit of this host in this step: the unit's name
      without ``.service``, the digest of everything it reads (``digest``), and its state from the
      probe (active, pid, applied release, whether a secret it reads changed); may be empty

    Every host of a run calls this for every step of the start order, units or not, so that
    pyinfra runs a step on all hosts before the next step anywhere.
    """
    q = shlex.quote
    todo = [(unit, release, current) for unit, release, current in units if needs_start(release, current)]
    if not todo:
        running = ", ".join(f"{unit} ({current['pid'] if current else None})" for unit, _, current in units)
        host.noop(f"running already: {running}" if units else "no unit of this host starts in this step")
        return
    for unit, release, current in todo:
        verb = "restart" if current is not None and current["active"] in ("active", "activating") else "start"
        # a unit file systemd has not loaded since it changed: loaded first, so that what starts is the file
        reload = ["systemctl daemon-reload"] if current is not None and current.get("needs_reload") else []
        yield " && ".join(
            [
                *reload,
                f"systemctl enable --quiet {q(unit)}.service",
                f"systemctl reset-failed {q(unit)}.service 2>/dev/null; systemctl {verb} {q(unit)}.service",
                f"install -d -m 0755 {APPLIED}",
                f"printf '%s\\n' {q(release)} > {APPLIED}/{q(unit)}",
            ]
        )


@operation()
def timer(unit: str, current: TimerState | None) -> Generator[str, None, None]:
    """
    Keep the timer ``unit`` enabled and waiting.

    + unit: the timer's name without ``.timer``
    + current: the timer's state from the probe (active, enabled)
    """
    if current is not None and current.get("active") == "active" and current.get("enabled") == "enabled":
        host.noop(f"{unit}.timer is enabled and active")
        return
    yield f"systemctl enable --now --quiet {shlex.quote(unit)}.timer"
