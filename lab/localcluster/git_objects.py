"""git object ids (blob, tree, commit) and git-lfs pointers, computed without git.

The fake Hub's repos (``localcluster.hub_repo``) carry the ids real git would give their content, so that
the huggingface_hub client, locks and recipes see what they would see on huggingface.co. Every id here is
what ``git hash-object`` / ``git write-tree`` / ``git commit-tree`` print for the same input.
"""

from __future__ import annotations

import hashlib
from typing import Any

AUTHOR = "kimi-deploy <kimi-deploy@localcluster.invalid>"


def git_blob_sha1(data: bytes) -> str:
    """git's blob id of ``data`` (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _git_object(kind: bytes, body: bytes) -> str:
    return hashlib.sha1(kind + b" %d\0" % len(body) + body, usedforsecurity=False).hexdigest()


def tree_ids(blobs: dict[str, str]) -> dict[str, str]:
    """git tree ids of every directory ("" is the root) for files ``{path: blob id}``, all mode 100644."""
    nested: dict[str, Any] = {}
    for path, oid in blobs.items():
        *dirs, name = path.split("/")
        node = nested
        for d in dirs:
            node = node.setdefault(d, {})
        node[name] = oid
    ids: dict[str, str] = {}

    def walk(node: dict[str, Any], where: str) -> str:
        body = b""
        # git orders entries by name, comparing a directory as if its name ended with "/".
        for name in sorted(node, key=lambda n: n + "/" if isinstance(node[n], dict) else n):
            child = node[name]
            if isinstance(child, dict):
                sub = walk(child, f"{where}/{name}" if where else name)
                body += b"40000 " + name.encode() + b"\0" + bytes.fromhex(sub)
            else:
                body += b"100644 " + name.encode() + b"\0" + bytes.fromhex(child)
        ids[where] = _git_object(b"tree", body)
        return ids[where]

    walk(nested, "")
    return ids


def commit_id(tree: str, parents: list[str], when: int, message: str) -> str:
    """git's commit id for a commit by ``AUTHOR`` at ``when`` (UTC)."""
    lines = [f"tree {tree}", *(f"parent {p}" for p in parents)]
    lines += [f"author {AUTHOR} {when} +0000", f"committer {AUTHOR} {when} +0000", "", message]
    return _git_object(b"commit", ("\n".join(lines) + "\n").encode())
