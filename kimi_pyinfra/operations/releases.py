"""The host's current release: one symlink, switched atomically, naming what runs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Generator, Mapping

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from kimi_deploy.host.programs import COLD_START_RECORD
from kimi_deploy.hostside.boundary_json import loads
from kimi_deploy.hostside.host_dirs import STATE_DIR
from kimi_deploy.hostside.requests import ColdStartRecordRequest, EngineStartAsked, ReleaseRecord
from kimi_pyinfra.cold_start import engine_starts, so_far
from kimi_pyinfra.operations.connector import connector_arguments


@operation()
def current(
    *,
    link: str,
    release_dir: str,
    record: ReleaseRecord | Mapping[str, object],
    links: dict[str, str],
    found: str | None,
    run: str,
    outcome: str = "switched",
) -> Generator[str, None, None]:
    """
    Point ``link`` (``/opt/kimi/current``) at ``release_dir``, which records this release.

    + link: the ``current`` symlink
    + release_dir: ``/opt/kimi/releases/<id>``, the id a digest of everything the release runs
    + record: what ``release.json`` in it says (engine, weights revision, unit digests, which
      leave secret contents out: the file is world-readable): the converge's, or for a rollback
      the one the host kept (its ``files`` taken only as a list of strings)
    + links: names in ``release_dir`` -> what they point to (``engine``, ``model``)
    + found: where ``link`` points now (from the host probe)
    + run: this run's id (``kimi_deploy.run_id``), logged with the switch
    + outcome: the word logged (``switched``; ``rolled-back`` by a rollback)

    A release folder is written once, with a copy of every file it renders but secrets (under
    ``files/``, for a rollback); switching is a rename of a new symlink over the old one, so
    ``link`` always names a complete release. The switch is appended to the host's release log.
    """
    if found == release_dir:
        host.noop(f"{link} is {release_dir}")
        return
    q = shlex.quote
    steps = [f"install -d -m 0755 {q(release_dir)}"]
    steps += [f"ln -sfn {q(target)} {q(release_dir)}/{q(name)}" for name, target in sorted(links.items())]
    text = json.dumps(record, sort_keys=True)
    listed = record.get("files")
    files = [q(p) for p in listed if isinstance(p, str)] if isinstance(listed, list) else []
    if files:
        copies = f"{q(release_dir)}/files"
        # With the files' own times: a rollback puts them back with these, and a unit that kept
        # running through this release (its files unchanged) must not read as started before them.
        steps.append(f"install -d -m 0755 {copies} && cp --parents --preserve=timestamps {' '.join(files)} {copies}/")
    steps += [
        f"printf '%s\\n' {q(text)} > {q(release_dir)}/release.json",
        f"ln -sfn {q(release_dir)} {q(link)}.new",
        f"mv -T {q(link)}.new {q(link)}",
        f"install -d -m 0755 {STATE_DIR}",
        _log(release_dir, outcome, run),
    ]
    yield " && ".join(steps)


LOG = f"{STATE_DIR}/releases.log"


def _log(release_dir: str, outcome: str, run: str) -> str:
    """Append ``<UTC time> <release dir> <outcome> <run id>`` to the host's release log."""
    q = shlex.quote
    stamp = '"$(date -u +%Y-%m-%dT%H:%M:%SZ)"'
    return f"printf '%s %s %s %s\\n' {stamp} {q(release_dir)} {q(outcome)} {q(run)} >> {LOG}"


@operation()
def serving(*, release_dir: str, last: list[str] | None, run: str) -> Generator[str, None, None]:
    """
    Record in the host's release log that ``release_dir`` serves (its smoke tests passed).

    + release_dir: the release now current
    + last: the log's last entry as the probe read it (``[time, release dir, outcome]``)
    + run: this run's id
    + engines: the engine units whose last start is read in their own log (``hostside.start_phases``)

    A converge that stops before this leaves the release marked only ``switched``: a rollback
    goes back to the latest release that was recorded serving.
    """
    if last is not None and last[1:] == [release_dir, "serving"]:
        host.noop(f"{release_dir} is recorded serving")
        return
    yield f"install -d -m 0755 {STATE_DIR} && " + _log(release_dir, "serving", run)


@operation()
def restored(*, release_dir: str, files: list[str]) -> Generator[str, None, None]:
    """
    Put the files a release rendered back in place from its copies, and tell systemd.

    + release_dir: the release to go back to (``/opt/kimi/releases/<id>``)
    + files: the paths it recorded (never a secret: secrets stay as they are)
    """
    if not files:
        host.noop(f"{release_dir} recorded no files")
        return
    q = shlex.quote
    relative = " ".join(q(path.lstrip("/")) for path in files)
    # With the copies' times: a unit that keeps running (its release the same in both) reads no
    # file written after its start, so the next converge does not restart it (state_probe).
    yield f"cd {q(release_dir)}/files && cp --parents --preserve=timestamps {relative} / && systemctl daemon-reload"


@operation()
def cold_start_recorded(
    *, current: str, releases: str, run: str, engines: list[EngineStartAsked]
) -> Generator[FunctionCommand, None, None]:
    """
    Keep how long this host's converge took, by phase, with the release it left serving
    (``cold-start.json``, which ``kimi-deploy status`` shows).

    + current: the ``current`` link (the release serving)
    + releases: the folder of the host's releases
    + run: this run's id
    + engines: the engine units whose last start is read in their own log (``hostside.start_phases``)

    The figures are the controller's (``kimi_pyinfra.cold_start``), of the steps that ended before
    this one: taken when the step runs, so a deploy adds it only on a host that takes steps.
    """
    arguments = connector_arguments()

    def record(state: State, host: Host) -> bool:
        figures = so_far(state, host)
        if figures is None:
            return True
        request: ColdStartRecordRequest = {
            "seconds": {phase: round(s, 1) for phase, s in figures.seconds.items()},
            "to_serving": round(figures.total, 1),
            "run": run,
            "current": current,
            "releases": releases,
            "engines": engines,
        }
        ok, output = host.run_shell_command(COLD_START_RECORD.command("python3", request), **arguments)
        if not ok:  # the release serves all the same: said, not failed
            for text in output.stderr_lines or ["cold start record failed"]:
                host.log_styled(text, fg="yellow", log_func=logger.warning)
            return True
        try:
            said = loads((output.stdout_lines or ["{}"])[-1], f"{host.name}: cold start record")
        except ValueError as exc:
            host.log_styled(str(exc), fg="yellow", log_func=logger.warning)
            return True
        engine_starts(state, host, said.get("engine") if isinstance(said, dict) else None)
        return True

    yield FunctionCommand(record, (), {})
