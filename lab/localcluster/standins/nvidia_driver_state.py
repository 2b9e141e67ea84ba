#!/usr/bin/python3
"""What the stand-in NVIDIA driver packages change on a test host, installed as /usr/lib/nvidia/standin-driver-state.

The stand-in ``nvidia-smi`` answers from /etc/kimi-fake-accelerators.json (``KIMI_FAKE_ACCELERATORS``
overrides the path): ``driver_version`` is the loaded kernel module's version, ``nvml_version`` the
userspace library's, ``driver_loaded`` whether a module is loaded at all. A real driver package
replaces the userspace libraries at once and the kernel module only at the next boot, so after an
upgrade nvidia-smi fails with "Driver/library version mismatch" until the host reboots. The
packages' maintainer scripts call:

    standin-driver-state userspace-installed VERSION PACKAGE   (postinst of nvidia-driver-cuda)
    standin-driver-state module-installed VERSION PACKAGE      (postinst of nvidia-kernel-open-dkms)
    standin-driver-state userspace-removed | module-removed    (their postrm on remove/purge)
    standin-driver-state boot                                   (nvidia-standin-boot.service)

and every change that needs a boot to take effect asks for one the Debian way: /run/reboot-required
and the package's name in /run/reboot-required.pkgs. What is installed is kept in
/var/lib/nvidia-standin/{userspace,module}. Stdlib only: it runs with the host's python3.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

CONFIG = "/etc/kimi-fake-accelerators.json"
STATE_DIR = "/var/lib/nvidia-standin"
RUN_DIR = "/run"


def _paths() -> tuple[Path, Path, Path]:
    # The environment overrides exist for tests on the controller; on a host nothing sets them.
    return (
        Path(os.environ.get("KIMI_FAKE_ACCELERATORS", CONFIG)),
        Path(os.environ.get("NVIDIA_STANDIN_STATE_DIR", STATE_DIR)),
        Path(os.environ.get("NVIDIA_STANDIN_RUN_DIR", RUN_DIR)),
    )


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _load(config: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    return data


def _save(config: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1) + "\n"
    if _read(config) != text.strip():
        _write(config, text)


def _loaded(data: dict[str, Any]) -> str | None:
    """The version of the kernel module running now, or None when none is loaded."""
    if not data.get("driver_loaded", True) or not data.get("driver_version"):
        return None
    return str(data["driver_version"])


def _reboot_required(run: Path, package: str) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "reboot-required").touch()
    pkgs = run / "reboot-required.pkgs"
    listed = (_read(pkgs) or "").split()
    if package not in listed:
        with pkgs.open("a", encoding="utf-8") as f:
            f.write(package + "\n")


def main(argv: list[str]) -> int:
    config, state, run = _paths()
    action, args = (argv[0], argv[1:]) if argv else ("", [])
    if action in ("userspace-installed", "module-installed") and len(args) == 2:
        version, package = args
        what = action.removesuffix("-installed")
        _write(state / what, version + "\n")
        data = _load(config)
        if what == "userspace":
            # The new libraries are in place at once; nvidia-smi uses them from now on.
            data["nvml_version"] = version
            _save(config, data)
        if _loaded(data) != version:
            _reboot_required(run, package)
        return 0
    if action in ("userspace-removed", "module-removed") and not args:
        (state / action.removesuffix("-removed")).unlink(missing_ok=True)
        return 0
    if action == "boot" and not args:
        module, userspace = _read(state / "module"), _read(state / "userspace")
        if module is None and userspace is None:
            return 0  # no stand-in driver package installed: the host keeps the driver it came with
        data = _load(config)
        if module is not None:
            data["driver_version"] = module
            data["driver_loaded"] = True
        if userspace is not None:
            data["nvml_version"] = userspace
        _save(config, data)
        return 0
    sys.stderr.write(
        "usage: standin-driver-state {userspace,module}-installed VERSION PACKAGE | {userspace,module}-removed | boot\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
