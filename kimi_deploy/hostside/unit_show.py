"""One ``systemctl show`` for every part of a host probe (hostside/host_probe.py), each part
answered exactly what its own ``systemctl show`` would have printed.

The hardware part asks systemd about the fabric manager and IMEX, the drivers part about the
NVIDIA services, the state part about the converge's units and timers, each with its own
``--property`` list: three systemctl processes, some 4 ms of CPU each on a converged host. This
runs one, over every unit and every property asked, and cuts each part's answer out of it.

systemctl prints one block per unit asked, in the order asked, a blank line between blocks (and
none after the last), each block holding the unit's properties that ``--property`` names, in
the order systemd sends them over D-Bus whatever that list's order (systemd's
src/systemctl/systemctl-show.c, ``show_one``: ``if (*new_line) printf("\\n")``, then
``bus_message_print_all_properties`` with the filter). A part's answer is therefore its units'
blocks, each with the lines of the properties it named, joined the same way. An answer is given
only when that holds for what came back: systemctl exited 0 and said nothing on stderr, printed
ASCII only (as text, any locale reads it alike), one block per unit asked whose ``Id`` is the
unit's own name (an alias shows its target's, a glob or a job id something else), and every line
``Key=value``. Otherwise, or for a part that names a unit twice or a property or unit not asked
here, ``answer`` says None and the part runs its own systemctl, as it did before: the answer is
the same either way, this only saves the processes.
"""

from __future__ import annotations

import os
import signal
import subprocess

from kimi_deploy.hostside.shared_queries import on_path

TYPE_CHECKING = False  # typing costs every probe several ms to import: for type checkers only
if TYPE_CHECKING:
    from collections.abc import Sequence

# The unit types systemd knows (a name without one of them is a service: ``systemctl show x`` shows
# ``x.service``).
UNIT_SUFFIXES = (
    ".service",
    ".socket",
    ".target",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".timer",
    ".path",
    ".slice",
    ".scope",
)
_ENV = {**os.environ, "LC_ALL": "C", "LANG": "C"}


def unit_id(name: str) -> str:
    """The ``Id`` systemd shows for ``name`` when it is the unit's own name (no alias)."""
    return name if name.endswith(UNIT_SUFFIXES) else f"{name}.service"


class UnitShow:
    """``systemctl show`` of every unit of ``asks`` (each part's properties and units), started
    now and read when a part first asks (``answer``), so that it runs beside the probe's other
    commands. ``timeout``: how long it may take (then every part runs its own)."""

    def __init__(self, asks: Sequence[tuple[Sequence[str], Sequence[str]]], timeout: float) -> None:
        self.properties = list(dict.fromkeys(p for props, _ in asks for p in props))
        self.units = list(dict.fromkeys(u for _, units in asks for u in units))
        self.timeout = timeout
        self.blocks: dict[str, list[str]] | None = None
        self.read = False
        self.proc: subprocess.Popen[bytes] | None = None
        # Id: each block says which unit it is; a unit named by a number is a job (not ours)
        if "Id" not in self.properties or not self.units or any(not u or u.isdigit() for u in self.units):
            return
        if on_path("systemctl") is None:
            return
        try:
            self.proc = subprocess.Popen(
                ["systemctl", "show", f"--property={','.join(self.properties)}", *self.units],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_ENV,
                start_new_session=True,
            )
        except OSError:
            self.proc = None

    def _collect(self) -> dict[str, list[str]] | None:
        """Each unit's lines, when what came back is as the module says; None otherwise."""
        if self.proc is None:
            return None
        try:
            out, err = self.proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            try:  # noqa: SIM105 - contextlib would cost the probe an import
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.communicate()
            return None
        if self.proc.returncode != 0 or err or not out.isascii() or b"\r" in out:
            return None
        return _blocks(out.decode("ascii"), self.units)

    def answer(self, properties: Sequence[str], units: Sequence[str]) -> str | None:
        """What ``systemctl show --property=<properties> <units>`` prints (stdout; it exits 0 and
        says nothing on stderr), or None when this run cannot say it."""
        if not self.read:
            self.blocks, self.read = self._collect(), True
        if self.blocks is None or len(set(units)) != len(units) or not set(properties) <= set(self.properties):
            return None
        if any(u not in self.blocks for u in units):
            return None
        wanted = set(properties)
        return "\n".join(
            "".join(f"{line}\n" for line in self.blocks[u] if line.split("=", 1)[0] in wanted) for u in units
        )


def _blocks(stdout: str, units: list[str]) -> dict[str, list[str]] | None:
    """``units`` -> the lines of its block in ``stdout`` (``systemctl show``'s, every line ending
    with a newline, a blank line between blocks), when there is one block per unit, in order, each
    of ``Key=value`` lines and saying the unit's own ``Id``; None otherwise."""
    lines = stdout.split("\n")
    if lines[-1] != "":
        return None
    found: list[list[str]] = [[]]
    for line in lines[:-1]:
        if not line:
            found.append([])
        elif "=" in line:
            found[-1].append(line)
        else:
            return None
    if len(found) != len(units) or any(f"Id={unit_id(u)}" not in block for u, block in zip(units, found, strict=True)):
        return None
    return dict(zip(units, found, strict=True))
