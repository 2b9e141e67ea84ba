"""An unprivileged operator on every host, as real fleets have: ``ops``, logging in with the
cluster's key and running what a deploy needs through sudo without a password.

pyinfra connects as ``ops`` and runs every command through ``sudo -H -n`` with ``_sudo = True`` in
the inventory's data (pyinfra's global arguments): a deploy that works as root must work so too.
The account is written into the host's files before it boots (passwd, group, shadow with no
password, a sudoers drop-in, the key), the same on every ``up``.
"""

from __future__ import annotations

import os
from pathlib import Path

from localcluster.image import write_into

NAME = "ops"
UID = GID = 1500
HOME = f"home/{NAME}"
SUDOERS = f"{NAME} ALL=(ALL:ALL) NOPASSWD: ALL\n"


def _with_line(root: Path, relative: str, key: str, line: str, mode: int) -> None:
    """``relative`` (passwd, group, shadow) with ``line`` as the entry of ``key``, once."""
    path = root / relative
    kept = [entry for entry in path.read_text(encoding="utf-8").splitlines() if entry.split(":", 1)[0] != key]
    write_into(root, relative, "\n".join([*kept, line]) + "\n", mode)


def ensure(root: Path, public_key: str) -> None:
    """The operator account in the host's root ``root``, able to log in with ``public_key``."""
    _with_line(root, "etc/passwd", NAME, f"{NAME}:x:{UID}:{GID}:kimi-cluster operator:/{HOME}:/bin/bash", 0o644)
    _with_line(root, "etc/group", NAME, f"{NAME}:x:{GID}:", 0o644)
    # "*": no password can log in; the key can
    _with_line(root, "etc/shadow", NAME, f"{NAME}:*:20000:0:99999:7:::", 0o640)
    write_into(root, f"etc/sudoers.d/{NAME}", SUDOERS, 0o440)
    ssh_dir = root / HOME / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    write_into(root, f"{HOME}/.ssh/authorized_keys", public_key, 0o600)
    for path in (root / HOME, ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, UID, GID, follow_symlinks=False)
    os.chmod(root / HOME, 0o700)
    os.chmod(ssh_dir, 0o700)
