"""The commands more than one part of a host probe runs, written once, and the reading of their
answers (``dpkg-query``'s installed packages, ``systemctl show``'s blocks), which the probe's
parts and the controller's hardware profile share.

The hardware and drivers parts run the same ``dpkg-query`` and ``systemctl show`` in one probe
(hostside/host_probe.py): the drivers part takes the hardware part's answers when the argv is
the same (``driver_probe.read_already``), so each runs once.
"""

from __future__ import annotations

# NVIDIA's packages and the keyring, one line each: name, version, db:Status-Abbrev ("ii ").
NVIDIA_PACKAGES = [
    "dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", "nvidia-*", "cuda-keyring", "cuda-drivers*",
]  # fmt: skip
SERVICE_STATES = ["systemctl", "show", "--property=Id,ActiveState,UnitFileState"]

TYPE_CHECKING = False  # typing costs every probe several ms to import: for type checkers only
if TYPE_CHECKING:
    from hostside.probe_types import InstalledPackage


def installed(stdout: str) -> dict[str, InstalledPackage]:
    """The installed packages of ``NVIDIA_PACKAGES``'s answer: db:Status-Abbrev is the desired
    action ("h": hold) then the state ("i": installed), e.g. "hi "; "un" and "rc" are not installed."""
    found: dict[str, InstalledPackage] = {}
    for line in stdout.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[1] and fields[2][1:2] == "i":
            found[fields[0]] = {"version": fields[1], "held": fields[2][:1] == "h"}
    return found


def blocks(stdout: str) -> list[dict[str, str]]:
    """``systemctl show``'s answer: one block of ``Key=value`` lines per unit asked, blank lines
    between (anything else, such as no systemd, gives blocks without keys)."""
    return [dict(line.split("=", 1) for line in b.splitlines() if "=" in line) for b in stdout.split("\n\n")]
