"""A host's power button: runs its systemd-nspawn again when the host reboots, like a real machine.

    python -m localcluster.bootloop --cgroup DIR [--cgroup DIR ...] -- systemd-nspawn ARGS...

systemd-nspawn exits with status 133 when the system it boots asks for a reboot (``systemctl reboot``
inside the host), and with anything else when that system powers off or nspawn itself fails;
systemd's own ``systemd-nspawn@.service`` relies on the same contract (``RestartForceExitStatus=133``).
This loop starts nspawn, and starts it again on 133 and only on 133; it exits with nspawn's status
otherwise. SIGTERM or SIGINT to the loop is passed on to nspawn (a clean poweroff) and ends the loop
whatever nspawn exits with, so a reboot racing a stop never boots the host again.

Each ``--cgroup DIR`` is the host's own cgroup in one hierarchy: nspawn is started in it (and makes its
``payload`` and ``supervisor`` cgroups below it), while this loop runs in ``DIR/bootloop`` so that no
process sits in a cgroup whose children nspawn manages. It uses nothing but the standard library.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

MODULE = "localcluster.bootloop"
LOOP_CGROUP = "bootloop"
# systemd-nspawn's status when the container's init asked for a reboot (systemd's EXIT_FORCE_RESTART).
EXIT_REBOOT = 133


def _say(message: str) -> None:
    sys.stdout.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} bootloop: {message}\n")
    sys.stdout.flush()


def _exit_status(returncode: int) -> int:
    # Popen reports death by signal N as -N; a shell would say 128 + N.
    return returncode if returncode >= 0 else 128 - returncode


def run(nspawn: Sequence[str], cgroups: Sequence[str]) -> int:
    """Boot with ``nspawn`` until the host powers off or the loop is told to stop; nspawn's last status."""
    stopping: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    procs_fds = [os.open(os.path.join(group, "cgroup.procs"), os.O_WRONLY) for group in cgroups]

    def join_cgroups() -> None:
        # Between fork and exec: only os.write on descriptors opened above.
        for fd in procs_fds:
            os.write(fd, b"0")

    boots, status = 0, 0
    while True:
        if stopping:
            # Told to stop while the host was rebooting: it stays off.
            _say("stopped between two boots")
            return _exit_status(status)
        boots += 1
        child = subprocess.Popen(list(nspawn), stdin=subprocess.DEVNULL, preexec_fn=join_cgroups)  # noqa: PLW1509
        if stopping:
            # The signal came before `child` was set: nspawn has not seen it yet.
            child.send_signal(stopping[0])
        status = child.wait()
        if stopping:
            _say(f"stopped, systemd-nspawn exited with {status}")
            return _exit_status(status)
        if status != EXIT_REBOOT:
            _say(f"systemd-nspawn exited with {status} after boot {boots}: the host is off")
            return _exit_status(status)
        _say(f"the host rebooted (systemd-nspawn exited with {EXIT_REBOOT}): boot {boots + 1}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--cgroup", action="append", default=[], help="the host's cgroup, one per hierarchy")
    parser.add_argument("nspawn", nargs=argparse.REMAINDER, help="-- systemd-nspawn and its arguments")
    args = parser.parse_args(argv)
    nspawn = args.nspawn[1:] if args.nspawn[:1] == ["--"] else args.nspawn
    if not nspawn:
        parser.error("no systemd-nspawn command line after --")
    sys.exit(run(nspawn, args.cgroup))


if __name__ == "__main__":
    main()
