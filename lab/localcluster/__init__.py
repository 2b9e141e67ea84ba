"""A local cluster of real test hosts, like ``kind`` for Kubernetes.

Each host is a systemd-nspawn container with systemd as PID 1 and sshd, its own network namespace
and address on a private bridge, and its own overlayfs on a shared, cached Debian 12 base image.
``kimi-deploy cluster up|status|down`` (or ``python -m localcluster``) drives it; ``state.json`` in
the state directory (``KIMI_CLUSTER_DIR``, default ``/var/lib/kimi-cluster``) tells other tools
where the hosts are. This module holds the helpers every part uses: ``run``, ``log``, ``hook`` and
``process_argv``.
"""

from __future__ import annotations

import importlib
import logging
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from localcluster.state import ClusterError

# The checkout the lab is part of (lab/localcluster/): the demo recipes the index and the Hub serve
# are its recipes/. The lab installs from a checkout only (scripts/demo, scripts/test).
CHECKOUT = Path(__file__).resolve().parents[2]

__all__ = ["ClusterError", "hook", "launch_detached", "log", "process_argv", "run"]

log = logging.getLogger("localcluster")
_missing_reported: set[str] = set()


def launch_detached(
    argv: Sequence[str],
    log_path: Path,
    banner: str,
    *,
    cwd: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached (own session, no stdin), its output appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {banner}\n".encode())
        out.flush()
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            preexec_fn=preexec_fn,  # noqa: PLW1509 - callers pass only async-signal-safe work
        )


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 120,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (never through a shell) and capture its output.

    With ``check`` a non-zero exit raises a ClusterError naming the command and its last error line.
    """
    args = list(argv)
    try:
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            env=None if env is None else dict(env),
            check=False,
        )
    except FileNotFoundError as exc:
        raise ClusterError(f"{args[0]}: command not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{shlex.join(args)}: no result within {timeout} s") from exc
    if check and proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        detail = lines[-1] if lines else "no output"
        raise ClusterError(f"{shlex.join(args)}: exit {proc.returncode}: {detail}")
    return proc


def hook(module: str, function: str) -> Callable[..., object] | None:
    """``module.function`` when that module exists, else None (logged): parts others write are optional.

    Only a missing module is forgiven; an error inside one that exists propagates.
    """
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        if module not in _missing_reported:
            _missing_reported.add(module)
            log.info("skipping %s.%s: module %s is not there", module, function, module)
        return None
    found: Callable[..., object] = getattr(loaded, function)
    return found


def process_argv(pid: int) -> list[str] | None:
    """The command line of a live process, or None when ``pid`` is gone or a zombie."""
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text(encoding="utf-8", errors="replace")
        raw = (proc / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The state letter follows the command name in parentheses, which may itself hold ')'.
    if stat.rsplit(")", 1)[-1].split()[:1] == ["Z"] or not raw:
        return None
    return [arg.decode("utf-8", errors="replace") for arg in raw.rstrip(b"\0").split(b"\0")]
