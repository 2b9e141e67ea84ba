"""The cluster's apt signing key: made once per cluster, exported for hosts, and signing ``Release`` files.

The key is an ed25519 signing key in a GnuPG home that is never served (``<state>/apt/signing``);
both of the ``apt`` service's repositories (NVIDIA's stand-in and the Debian mirror) are signed with
it. A ``Release`` file is signed the two ways apt reads (https://wiki.debian.org/DebianRepository/Format,
"Release files"): ``InRelease``, clear-signed, and ``Release.gpg``, a detached signature.
"""

from __future__ import annotations

from pathlib import Path

from localcluster import run
from localcluster.state import ClusterError

KEY_UID = "kimi-deploy local cluster CUDA repository <kimi-cluster@localhost>"
# The GnuPG home's name inside a repository service's root directory.
SIGNING_DIR = "signing"


def signing_home(service_root: Path) -> Path:
    """The GnuPG home of the key that signs what the service rooted at ``service_root`` serves."""
    return service_root / SIGNING_DIR


def _gpg(home: Path, *args: str) -> str:
    argv = ["gpg", "--homedir", str(home), "--batch", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", ""]
    return run([*argv, *args]).stdout


def _stop_agent(home: Path) -> None:
    # Signing starts a gpg-agent for this home; nothing of the build may outlive it.
    run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)


def _secret_fingerprint(home: Path) -> str | None:
    if not home.is_dir():
        return None
    listing = _gpg(home, "--with-colons", "--list-secret-keys")
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    return fingerprints[0] if fingerprints else None


def ensure_key(home: Path) -> str:
    """The fingerprint of the repository's signing key in GnuPG home ``home``, made on first use."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.chmod(0o700)
    try:
        found = _secret_fingerprint(home)
        if found is not None:
            return found
        _gpg(home, "--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
        made = _secret_fingerprint(home)
    finally:
        _stop_agent(home)
    if made is None:
        raise ClusterError(f"{home}: gpg made no signing key")
    return made


def public_key(home: Path, fingerprint: str, armor: bool = False) -> bytes:
    """The signing key's public part: a binary keyring (as apt's ``signed-by`` takes) or armored text."""
    out = home / ("export.asc" if armor else "export.gpg")
    out.unlink(missing_ok=True)
    run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--yes",
            *(["--armor"] if armor else []),
            "--output",
            str(out),
            "--export",
            fingerprint,
        ]
    )
    data = out.read_bytes()
    out.unlink()
    if not data:
        raise ClusterError(f"{home}: no public key {fingerprint}")
    return data


def sign(home: Path, fingerprint: str, release_file: Path) -> None:
    """Write ``InRelease`` (clear-signed) and ``Release.gpg`` (detached) next to ``release_file``."""
    where = release_file.parent
    for stale in ("InRelease", "Release.gpg"):
        (where / stale).unlink(missing_ok=True)
    try:
        common = ("--local-user", fingerprint, "--digest-algo", "SHA512")
        _gpg(home, *common, "--clearsign", "--output", str(where / "InRelease"), str(release_file))
        _gpg(home, *common, "--armor", "--detach-sign", "--output", str(where / "Release.gpg"), str(release_file))
    finally:
        _stop_agent(home)
