"""The commands more than one part of a host probe runs, written once, and the reading of their
answers (``dpkg-query``'s installed packages, ``systemctl show``'s blocks), which the probe's
parts and the controller's hardware profile share.

The hardware and drivers parts run the same ``dpkg-query`` and ``systemctl show`` in one probe
(hostside/host_probe.py): the drivers part takes the hardware part's answers when the argv is
the same (``driver_probe.read_already``), so each runs once. The parts find their commands and
hash their small files through ``on_path`` and ``file_sha256``: shutil and hashlib would cost
every probe their imports (bz2, lzma, fnmatch; OpenSSL), several ms of a converged host's probe.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

# NVIDIA's packages (Debian's and Ubuntu's names) and the keyring, one line each: name, version,
# db:Status-Abbrev ("ii ").
NVIDIA_PACKAGES = [
    "dpkg-query",
    "-W",
    "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n",
    "nvidia-*",
    "cuda-keyring",
    "cuda-drivers*",
    "libnvidia-compute*",
    "nvlsm",
    "infiniband-diags",
]
SERVICE_STATES = ["systemctl", "show", "--property=Id,ActiveState,UnitFileState"]

TYPE_CHECKING = False  # typing costs every probe several ms to import: for type checkers only
if TYPE_CHECKING:
    from typing import Any

    from kimi_deploy.hostside.probe_types import InstalledPackage


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


def on_path(command: str) -> str | None:
    """Where ``command`` is, as ``shutil.which`` finds it: itself when it names a folder, else the
    first executable file of that name in PATH's folders."""
    if os.sep in command:
        return command if os.path.isfile(command) and os.access(command, os.X_OK) else None
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _sha256() -> Any:
    """Python's own SHA-256 (module ``_sha2`` from 3.12, ``_sha256`` before), hashlib's without it:
    as fast as OpenSSL's for the few KB of a unit file, without loading OpenSSL."""
    if not _SHA256:
        for name in ("_sha2", "_sha256"):
            try:
                _SHA256.append(__import__(name).sha256)
                break
            except ImportError:
                continue
        else:
            import hashlib  # noqa: PLC0415 - a Python built without its own hash modules

            _SHA256.append(hashlib.sha256)
    return _SHA256[0]


_SHA256: list[Any] = []  # the constructor _sha256 found, once per process


def file_sha256(path: str) -> str | None:
    """The sha256 of a small file (read whole), None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return str(_sha256()(data).hexdigest())


def owner_mode(path: str) -> str | None:
    """``owner:group:mode`` of the file at ``path`` (mode in octal, as ``modes`` names it)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"{owner}:{group}:{stat.S_IMODE(st.st_mode):o}"
