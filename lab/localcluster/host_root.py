"""What the cluster writes into a test host's root filesystem before it boots: files written only
when they differ, and the oneshot units its stand-ins run early at every boot."""

from __future__ import annotations

import os
from pathlib import Path


def write_changed(path: Path, data: bytes, mode: int) -> None:
    """Write only what differs, so that installing twice changes nothing (not even a timestamp)."""
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data and (path.stat().st_mode & 0o777) == mode:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def early_boot_unit(description: str, command: str) -> str:
    """A oneshot unit run once per boot before ``sysinit.target``, where systemd loads kernel
    modules (systemd-modules-load.service is ordered so too), with its ``[Install]`` section."""
    return f"""\
[Unit]
Description={description}
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={command}

[Install]
WantedBy=sysinit.target
"""
