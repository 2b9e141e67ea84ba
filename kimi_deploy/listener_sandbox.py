"""The sandbox of the transient services a converge starts for other hosts of its run to reach
(the weights peer, the communication check's listeners): they listen on the host's address and
answer, and may do nothing else on the host."""

from __future__ import annotations

import shlex

# systemd.exec(5) settings every such service runs under, beside its own user and limits.
LISTENER_SANDBOX = (
    "Type=notify",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectControlGroups=yes",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "CapabilityBoundingSet=",
    "LockPersonality=yes",
    "RestrictSUIDSGID=yes",
    "SystemCallArchitectures=native",
    "UMask=0077",
)


def stop_unit(unit: str) -> str:
    """The shell command stopping the transient service ``unit`` if it runs."""
    q = shlex.quote(f"{unit}.service")
    return f"if systemctl is-active --quiet {q}; then systemctl stop {q}; fi"


def transient_service(unit: str, description: str, properties: tuple[str, ...], command: str) -> str:
    """The shell command (re)starting ``command`` as the transient service ``unit`` with
    ``properties``: one left by an earlier run is stopped and forgotten first. With
    ``Type=notify`` it returns once the service says it is ready."""
    q = shlex.quote
    return " ".join(
        [
            f"{stop_unit(unit)}; systemctl reset-failed {q(unit + '.service')} 2>/dev/null;",
            f"systemd-run --quiet --collect --unit={q(unit)}",
            f"--description={q(description)}",
            *(f"--property={q(p)}" for p in properties),
            command,
        ]
    )
