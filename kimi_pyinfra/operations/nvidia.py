"""NVIDIA's driver from its apt repository: the repository, the pin, the packages, the reboot, the services.

Each operation takes what ``kimi_deploy.accelerators.nvidia_drivers`` decided from the host's probe and yields
nothing when the host is already so. apt's refusals end the operation with one line
``kimi-deploy: drivers: apt-get install refused: <apt's reason>`` after apt's own output.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Generator
from typing import Any

from pyinfra import logger
from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.operation import operation
from pyinfra.api.state import State
from pyinfra.context import host

from kimi_deploy.accelerators.nvidia_drivers import (
    PIN_PREFIX,
    Reboot,
    loaded_driver,
    reboot_reason,
    reboot_refusal,
    upstream,
)
from kimi_deploy.hostside.host_dirs import LOG_DIR
from kimi_deploy.hostside.requests import DriversRequest
from kimi_pyinfra.facts.drivers import DriversState

APT_ENV = "DEBIAN_FRONTEND=noninteractive"
# Held packages move only when a deploy says so; a changed config file the host holds stays.
APT_INSTALL = (
    "apt-get -q -y --allow-downgrades --allow-change-held-packages "
    "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold install"
)
DRIVERS_LOG = f"{LOG_DIR}/drivers.log"
# A fetch that fails prints one line, not a traceback; python3 is on every host (the probe needs it).
_FETCH = (
    "import sys, urllib.request\n"
    "try:\n    urllib.request.urlretrieve(sys.argv[1], sys.argv[2])\n"
    "except Exception as e:\n    sys.exit(f'kimi-deploy: drivers: cannot fetch {sys.argv[1]}: {e}')\n"
)


def apt_install(args: list[str], extra: str = "") -> str:
    """``apt-get install`` of ``args`` (quoted here; ``extra``: shell words added as they are),
    ending in one line naming apt's reason when it refuses."""
    words = " ".join(shlex.quote(a) for a in args) + (f" {extra}" if extra else "")
    # apt's reason: the first unmet dependency it lists, else its first error.
    pick = "{ printf '%s\\n' \"$out\" | grep -m1 ' : Depends: ' || printf '%s\\n' \"$out\" | grep -m1 '^E: '; }"
    return (
        f"out=$({APT_ENV} {APT_INSTALL} {words} 2>&1); rc=$?; printf '%s\\n' \"$out\"; "
        f"if [ $rc -ne 0 ]; then why=$({pick} | sed 's/^ *//'); "
        "printf 'kimi-deploy: drivers: apt-get install refused: %s\\n' \"${why:-exit status $rc}\" >&2; exit $rc; fi"
    )


def candidate_is(package: str, version: str, refusal: str) -> str:
    """Stop with ``refusal`` (``{version}``: apt's candidate) unless apt would install ``version``
    of ``package``."""
    said = "kimi-deploy: " + refusal.replace("%", "%%").replace("{version}", "%s") + "\\n"
    q = shlex.quote
    return (
        f"c=$(apt-cache policy {q(package)} | sed -n 's/^ *Candidate: *//p'); c=${{c#*:}}; c=${{c%-*}}; "
        f'[ "$c" = {q(version)} ] || {{ printf {q(said)} "$c" >&2; exit 1; }}'
    )


@operation()
def repository(url: str, keyring: str, present: bool, refresh: bool) -> Generator[str, None, None]:
    """
    Point apt at NVIDIA's repository with its ``cuda-keyring`` package, and read it when needed.

    + url: the repository for the host's release, ``<base>/debian12/x86_64``
    + keyring: the keyring package's file in it (``cuda-keyring_1.1-1_all.deb``)
    + present: whether the probe found the keyring installed and a source pointing at ``url``
    + refresh: whether packages will be installed this run (apt must read the repository first)
    """
    if present and not refresh:
        host.noop(f"cuda-keyring points apt at {url}")
        return
    q = shlex.quote
    if not present:
        deb = "/tmp/kimi-cuda-keyring.deb"  # noqa: S108 - root's own download, removed at once
        yield (
            f"python3 -c {q(_FETCH)} {q(f'{url}/{keyring}')} {deb} && {APT_ENV} dpkg -i {deb}; "
            f"rc=$?; rm -f {deb}; exit $rc"
        )
    yield "apt-get -q update --error-on=any"


def pin_offered(package: str, repository: str) -> str:
    """Stop, before any driver package changes, when the host's repository tree has no ``package``,
    with one line naming the branches and releases it does pin (a tree per OS and architecture:
    ``debian12/sbsa`` carries other branches than ``debian12/x86_64``)."""
    q = shlex.quote
    said = f"kimi-deploy: drivers: {repository} has no {package}: it pins branches %s and releases %s\n"
    listed = f"apt-cache pkgnames {q(PIN_PREFIX)} | sed 's/^{PIN_PREFIX}//' | sort -V"
    return (
        f"apt-cache show {q(package)} >/dev/null 2>&1 || {{ p=$({listed}); "
        "b=$(printf '%s\n' $p | grep -v '[.]' | paste -sd, - | sed 's/,/, /g'); "
        "r=$(printf '%s\n' $p | grep '[.]' | paste -sd, - | sed 's/,/, /g'); "
        f'printf {q(said)} "${{b:-none}}" "${{r:-none}}" >&2; exit 1; }}'
    )


@operation()
def pinned(package: str, installed: bool, repository: str) -> Generator[str, None, None]:
    """
    Install the pinning package (before the driver, as NVIDIA's guide asks); it replaces any other.
    A repository tree without it stops the host first, naming what the tree pins.

    + package: ``nvidia-driver-pinning-<branch>`` or ``nvidia-driver-pinning-<version>``
    + installed: whether the probe found it installed
    + repository: the host's repository tree (``<base>/debian12/sbsa``), for the refusal
    """
    if installed:
        host.noop(f"{package} is installed")
        return
    yield pin_offered(package, repository)
    yield apt_install([package])


@operation()
def removed(packages: list[str]) -> Generator[str, None, None]:
    """
    Remove NVIDIA packages a host must not run (a fabric manager on a host without NVSwitch), held or not.

    + packages: the installed packages to remove with their configuration
    """
    if not packages:
        host.noop("no NVIDIA package to remove")
        return
    q = " ".join(shlex.quote(p) for p in packages)
    yield f"apt-mark unhold {q} >/dev/null && {APT_ENV} apt-get -q -y --allow-change-held-packages remove --purge {q}"


@operation()
def packages(
    install: list[str],
    hold: list[str],
    unheld: list[str],
    *,
    headers: str | None,
    version: str,
    keep_loaded: str | None = None,
    reboot_line: str = "",
) -> Generator[str, None, None]:
    """
    Install the driver set with the fabric manager and IMEX in one apt transaction, and hold them.

    + install: ``apt-get install`` arguments (``name`` or ``name=version``) of what is missing or moves
    + hold: every package of the set (held after an install, so unattended upgrades cannot move them)
    + unheld: installed packages of the set that are not held
    + headers: the running kernel's headers package DKMS builds against, installed with the
      driver when a repository of the host offers it (None: the host has them)
    + version: the driver version the set is at after this (for the no-op sentence)
    + keep_loaded: the loaded driver's version when this run may not reboot and apt picks the
      release: anything else as apt's candidate stops the host with ``reboot_line`` (``{version}``:
      the candidate) before the install
    """
    q = shlex.quote
    if install and keep_loaded:
        yield candidate_is(hold[0], keep_loaded, reboot_line)
    if install:
        # Headers only where apt knows the package: a kernel no repository offers headers for (a
        # vendor or in-house build) brings its own, and their absence must not fail the install.
        find = f"h=$(apt-cache show {q(headers)} >/dev/null 2>&1 && echo {q(headers)}); " if headers else ""
        yield find + apt_install(install, "$h" if headers else "")
        yield f"apt-mark hold {' '.join(q(p) for p in hold)} >/dev/null"
        return
    if unheld:
        yield f"apt-mark hold {' '.join(q(p) for p in unheld)} >/dev/null"
        return
    host.noop(f"{', '.join(hold)} at {version} are installed and held")


def _log(line: str) -> str:
    stamped = f"printf '%s %s\\n' \"$(date -Ins)\" {shlex.quote(line)} >> {DRIVERS_LOG}"
    return f"install -d -m 0755 {LOG_DIR} && {stamped}"


@operation()
def rebooted(
    reboot: Reboot, allowed: bool, driver_package: str, request: DriversRequest, timeout_s: int = 1800
) -> Generator[StringCommand | FunctionCommand, None, None]:
    """
    Run the installed driver: reboot the host when the loaded one differs, then check NVML agrees.

    + reboot: ``no``: the host runs its installed driver; ``yes``: it must reboot; ``check``: the
      install decides (apt picked the release), read again on the host before rebooting
    + allowed: whether this run may reboot (``--data kimi_reboot=allowed``); without it a host that
      needs a reboot stops here with one line saying so
    + driver_package: the package carrying the driver's version (``nvidia-driver-cuda``)
    + request: the drivers probe's request, read again before and after the reboot
    + timeout_s: how long the host may take to come back (a server's firmware takes minutes)

    Call it with ``_serial=True``: hosts then reboot one at a time, each back before the next goes.
    Every reboot is recorded on the host in ``/var/log/kimi/drivers.log``.
    """
    if reboot == "no":
        host.noop("the loaded NVIDIA driver is the installed one")
        return
    seen: dict[str, Any] = {}

    def decide(state: State, host: Host) -> bool:
        found = host.get_fact(DriversState, request=request)
        seen.update(found=found, reason=reboot_reason(found, driver_package))
        if seen["reason"] is None:
            host.log_styled("the installed NVIDIA driver is loaded: no reboot needed", log_func=logger.info)
            return True
        if not allowed:
            installed = upstream(found["packages"][driver_package]["version"])
            host.log_styled(reboot_refusal(host.name, installed, found), fg="red", log_func=logger.error)
            return False
        return True

    yield FunctionCommand(decide, (), {})
    if seen.get("reason") is None:
        return
    # Detached, so that the SSH channel closes before the system goes down.
    yield StringCommand(
        f"{_log('reboot: ' + seen['reason'])} && ( ( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 & )"
    )
    yield FunctionCommand(_back, (seen["found"]["boot_id"], timeout_s), {})

    def agree(state: State, host: Host) -> bool:
        found = host.get_fact(DriversState, request=request)
        reason = reboot_reason(found, driver_package)
        if reason is not None:
            host.log_styled(f"{host.name}: drivers: after the reboot {reason}", fg="red", log_func=logger.error)
            return False
        seen["loaded"] = loaded_driver(found)[0]
        return True

    yield FunctionCommand(agree, (), {})
    yield StringCommand(_log(f"back: driver {seen['loaded']} loaded, NVML agrees"))


def _back(state: State, host: Host, old_boot: str, timeout_s: float) -> bool:
    """Wait until the host answers from a boot other than ``old_boot`` and has finished booting."""
    time.sleep(2)
    host.disconnect()
    deadline = time.monotonic() + timeout_s
    check = StringCommand("cat /proc/sys/kernel/random/boot_id; timeout 300 systemctl is-system-running --wait")
    while time.monotonic() < deadline:
        host.connect(show_errors=False)
        if host.connected:
            try:
                _, output = host.run_shell_command(check, _timeout=330)
                lines = output.stdout_lines
            except Exception:  # noqa: BLE001 - a connection made while the old system went down
                lines = []
            if lines and lines[0].strip() != old_boot and lines[-1].strip() in ("running", "degraded"):
                return True
            host.disconnect()
        time.sleep(1)
    host.log_styled(f"{host.name}: drivers: not back from the reboot within {timeout_s:g} s", log_func=logger.error)
    return False


@operation()
def service(
    unit: str, active: str, enabled: str, restart: bool, modules: list[str] | tuple[str, ...] = ()
) -> Generator[str, None, None]:
    """
    Keep an NVIDIA service (fabric manager, IMEX) enabled and running, restarted when it changed.

    + unit: the unit's name without ``.service``
    + active, enabled: its state from the probe
    + restart: whether its package or configuration changes this run
    + modules: kernel modules it needs loaded (``ib_umad`` for the NVLink subnet manager), loaded
      with ``modprobe`` before it starts; a module the kernel lacks stops the host in one line
    """
    if active == "active" and enabled == "enabled" and not restart:
        host.noop(f"{unit} is enabled and active")
        return
    q = shlex.quote(f"{unit}.service")
    if modules:
        names = " ".join(shlex.quote(m) for m in modules)
        yield (
            f"out=$(modprobe -a {names} 2>&1) || {{ printf 'kimi-deploy: drivers: %s needs kernel modules %s: %s\\n' "
            f'{q} {shlex.quote(", ".join(modules))} "$(printf \'%s\' "$out" | head -n 1)" >&2; exit 1; }}'
        )
    start = f"systemctl restart {q}" if restart and active == "active" else f"systemctl start {q}"
    # Both daemons refuse a driver of another version, and exit: say so instead of reporting success.
    yield (
        f"systemctl enable --quiet {q} && {start} && sleep 1 && systemctl is-active --quiet {q} || "
        f"{{ printf 'kimi-deploy: drivers: %s is %s\\n' {q} \"$(systemctl is-active {q})\" >&2; "
        f"journalctl -u {q} -n 3 --no-pager -o cat >&2; exit 1; }}"
    )
