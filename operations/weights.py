"""Model weights: one folder per pinned revision, synced and verified against the lock."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from pyinfra.api.operation import operation
from pyinfra.context import host

from kimi_deploy.hostside_command import hostside_command


@operation()
def revision(
    *,
    repo: str,
    revision: str,
    path: str,
    lock: dict[str, list[Any]],
    python: str,
    endpoint: str | None,
    token_file: str | None,
    current: dict[str, Any] | None,
    full_verify: bool = False,
) -> Generator[str, None, None]:
    """
    Hold exactly the files of ``repo`` at ``revision`` in ``path``, each matching the lock.

    + repo: the Hub repository (``moonshotai/Kimi-K3.1-Pro``)
    + revision: the pinned 40-hex commit
    + path: the revision's folder, e.g. ``/srv/models/moonshotai--Kimi-K3.1-Pro/<revision>``
    + lock: ``{path: [size, digest]}`` from the recipe's lock file
    + python: the interpreter of the venv holding huggingface_hub
    + endpoint: the Hub or mirror URL (None: huggingface_hub's default)
    + token_file: a host file (mode 0600) holding the Hub token, if any
    + current: what the host probe found (missing, unverified and extra files)
    + full_verify: re-hash every file now, whatever the cache says (finds silent corruption)

    Files are verified on the host (sha256 for LFS files, git blob ids for small ones), results
    cached by (size, mtime, inode): a converged host hashes nothing.
    """
    if (
        not full_verify
        and current is not None
        and current["exists"]
        and not (current["missing"] or current["unverified"] or current["extra"])
    ):
        host.noop(f"{repo}@{revision[:12]}: all {len(lock)} files verified in {path}")
        return
    request = {
        "repo": repo,
        "revision": revision,
        "dir": path,
        "lock": lock,
        "endpoint": endpoint,
        "token_file": token_file,
        "retries": 2,
        "full": full_verify,
    }
    yield hostside_command(python, "weights_sync.py", request)
