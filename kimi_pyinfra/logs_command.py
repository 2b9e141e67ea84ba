"""``kimi-deploy logs INVENTORY [HOST] [UNIT]``: the journals of the units the plan puts on the hosts,
followed over pyinfra's own connections.

The hosts and their units come from the plan, each host's recipe its ``kimi_recipe`` data as the
deploys read it (``kimi_deploy.serving.journals`` checks what the command names). The connections
are pyinfra's: the inventory loaded as pyinfra loads it (``--data`` as its own), each host reached
by its connector with the inventory's ``ssh_*`` data (user, port, key, known hosts) and its
``_sudo`` data. On each host one ``journalctl`` reads the units' journals (the last ``-n`` lines,
then each new line until Ctrl-C, or only those with ``--no-follow``). A host's lines are its text:
each is shown through ``printable``, prefixed with the host's name when there are several.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from kimi_deploy.converge.plan import plan_converge
from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_text import printable
from kimi_deploy.plan.deploy_plan import DEFAULT_RECIPE, part_of
from kimi_deploy.plan.planner import plan
from kimi_deploy.recipe_file import load_recipe
from kimi_deploy.serving.journals import journal_command, journal_targets
from kimi_pyinfra.inventory_file import from_pyinfra, pyinfra_inventory


def override_data(words: Sequence[str]) -> dict[str, Any]:
    """``--data KEY=VALUE`` words as pyinfra's CLI reads them (``true``, numbers, JSON parsed);
    ``ConfigError`` for a word without ``=``."""
    from pyinfra_cli.util import parse_cli_arg  # noqa: PLC0415 - pyinfra's CLI patches with gevent on import

    out: dict[str, Any] = {}
    for word in words:
        if "=" not in word:
            raise ConfigError("", "--data", f"expected KEY=VALUE, found {word!r}")
        key, value = word.split("=", 1)
        out[key] = parse_cli_arg(value)
    return out


def planned_units(inventory: Any, source: str) -> dict[str, list[str]]:
    """Every host the plan places, in inventory order, with the units its converge starts there
    (planned as ``kimi-deploy plan`` plans: no secret read). ``inventory``: pyinfra's."""
    ours = from_pyinfra(inventory, source)
    plans: dict[str, Any] = {}
    out: dict[str, list[str]] = {}
    for host in ours.hosts:
        recipe_file = host.vars.kimi_recipe or DEFAULT_RECIPE
        if recipe_file not in plans:
            recipe = load_recipe(recipe_file)
            plans[recipe_file] = (recipe, plan(recipe, recipe_file, ours))
        recipe, whole = plans[recipe_file]
        if host.name not in {h.host for h in whole.hosts}:
            continue
        todo = plan_converge(part_of(recipe, recipe_file, host, whole), os.environ, plan_only=True)
        out[host.name] = [u.name for u in todo.units]
    return out


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _follow(state: Any, host: Any, command: str, prefix: str) -> int:
    """Run ``command`` on ``host`` (connected), printing each line of its output as it comes; its
    exit status."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments  # noqa: PLC0415
    from pyinfra.api.command import StringCommand  # noqa: PLC0415
    from pyinfra.connectors.util import make_unix_command_for_host  # noqa: PLC0415

    # the host's own _sudo, _sudo_user, ... data, as pyinfra gives them to a fact's command
    arguments, _ = pop_global_arguments(state, host, {})
    given = {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS}
    for key in ("_get_pty", "_timeout", "_stdin", "_success_exit_codes"):
        given.pop(key, None)
    client = getattr(host.connector, "client", None)
    if client is None:
        # a connector without an SSH client (@local, @docker): its output once the command ends
        ok, output = host.run_shell_command(StringCommand(command), **given)
        for line in output.output_lines:
            _say(prefix + printable(line))
        return 0 if ok else 1
    raw = make_unix_command_for_host(state, host, StringCommand(command), **given).get_raw_value()
    channel = client.get_transport().open_session()
    try:
        channel.set_combine_stderr(True)
        channel.exec_command(raw)
        for line in channel.makefile("rb"):
            _say(prefix + printable(line.decode("utf-8", errors="replace").rstrip("\r\n")))
        return int(channel.recv_exit_status())
    finally:
        channel.close()


def run_logs(source: str, host: str | None, unit: str | None, *, lines: int, follow: bool, data: Sequence[str]) -> int:
    """Print the journals ``host`` and ``unit`` name (None: every host's, every unit's of the plan)
    until they end (``follow``: until Ctrl-C); 1 when a host could not be reached or its
    ``journalctl`` failed, 130 on Ctrl-C. ``ConfigError`` for what the plan refuses."""
    if lines < 0:
        raise ConfigError("", "-n", f"expected a number of lines >= 0, found {lines}")
    inventory = pyinfra_inventory(source, override_data(data))
    targets = journal_targets(source, planned_units(inventory, source), host, unit)

    import gevent  # type: ignore[import-untyped]  # noqa: PLC0415 - pyinfra's, after its CLI patched
    from pyinfra.api.config import Config  # noqa: PLC0415
    from pyinfra.api.exceptions import ConnectError  # noqa: PLC0415
    from pyinfra.api.state import State  # noqa: PLC0415
    from pyinfra.context import ctx_state  # noqa: PLC0415

    state = State(check_for_changes=False)
    state.init(inventory, Config())  # type: ignore[no-untyped-call]
    several = len(targets) > 1

    def one(name: str, units: list[str]) -> int:
        h = inventory.get_host(name)
        try:
            h.connect(show_errors=False, raise_exceptions=True)
        except ConnectError as exc:
            print(printable(f"kimi-deploy logs: {name}: cannot connect: {exc}"), file=sys.stderr)
            return 1
        if follow and getattr(h.connector, "client", None) is None:
            # @local, @docker...: pyinfra gives their output once the command ends, which a follow never does
            print(f"kimi-deploy logs: {name}: its connector follows nothing: use --no-follow", file=sys.stderr)
            return 1
        code = _follow(state, h, journal_command(units, lines, follow), f"[{name}] " if several else "")
        if code:
            print(f"kimi-deploy logs: {name}: journalctl exited with status {code}", file=sys.stderr)
        return 1 if code else 0

    # Ctrl-C ends the command, the way it ends journalctl --follow: not an error for gevent's hub to print
    hub = gevent.get_hub()
    hub.NOT_ERROR = (*hub.NOT_ERROR, KeyboardInterrupt)
    with ctx_state.use(state):
        greenlets = [gevent.spawn(one, name, units) for name, units in targets.items()]
        try:
            gevent.joinall(greenlets, raise_error=True)
        except KeyboardInterrupt:
            gevent.killall(greenlets)
            return 130
        finally:
            for h in inventory:
                if h.connected:
                    h.disconnect()
    return 1 if any(g.value for g in greenlets) else 0
