"""Writing a model repo, with its history, in the layout ``localcluster.hub`` serves.

``write_repo(root, repo_id, history, ...)`` stores every file of every commit and records the commits, the
refs and a summary (``RepoInfo``); repos written under one root share its object store. Ids are real git ids
(``localcluster.git_objects``): the same content gives the same commit ids on every run and machine.
Streamed files are LFS files: their git blob is the LFS pointer and their LFS oid is the content's sha256.
``materialize(root, repo_id, commit, dest)`` writes one commit's files out as a plain model folder.

On-disk layout::

    root/objects/<sha256>                           every file's content, stored once
    root/repos/<org>/<name>/refs.json               {"branches": {name: sha}, "tags": {name: sha}}
    root/repos/<org>/<name>/commits/<sha>.json      one manifest per commit (see ``_manifest``)
    root/repos/<org>/<name>/info.json               ``RepoInfo`` as JSON, plus the build parameters
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localcluster.git_objects import AUTHOR, commit_id, git_blob_sha1, lfs_pointer, tree_ids

# The manifests' layout, which ``localcluster.hub`` reads.
MANIFEST_FORMAT = 1

# A file's content: a small file is its bytes (a plain git file); an LFS file is a stream made on demand
# (shards can be large).
Content = bytes | Callable[[], Iterable[bytes]]


@dataclass(frozen=True)
class FileEntry:
    """One file at one commit. ``sha256`` is of the content (the LFS oid for LFS files); ``git_blob_sha1`` is
    the git blob id (of the content, or of the LFS pointer when ``is_lfs``)."""

    size: int
    sha256: str
    git_blob_sha1: str
    is_lfs: bool


@dataclass(frozen=True)
class RepoInfo:
    """What a test or a lock needs: ``commits`` maps commit names ("a", "b") to commit ids, ``files`` maps a
    commit id to its files, ``refs`` maps branch and tag names to commit ids."""

    repo_id: str
    commits: dict[str, str]
    files: dict[str, dict[str, FileEntry]]
    refs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Commit:
    """One commit to write: ``name`` is its key in ``RepoInfo.commits``, ``when`` its time (UTC seconds),
    ``message`` its title, a blank line and its body, ``files`` its whole tree."""

    name: str
    when: int
    message: str
    files: Mapping[str, Content]


def json_bytes(obj: Any) -> bytes:
    """``obj`` as the repos' JSON files hold it: indented by 2, one final newline."""
    return (json.dumps(obj, indent=2) + "\n").encode()


def repo_dir(root: Path, repo_id: str) -> Path:
    """Where repo ``repo_id`` lives under ``root``."""
    return Path(root) / "repos" / repo_id


def load_info(root: Path, repo_id: str) -> RepoInfo:
    """Read the ``info.json`` that ``write_repo`` wrote (no generation)."""
    data = json.loads((repo_dir(root, repo_id) / "info.json").read_text())
    files = {c: {p: FileEntry(**e) for p, e in fs.items()} for c, fs in data["files"].items()}
    return RepoInfo(data["repo_id"], data["commits"], files, data.get("refs", {}))


def materialize(root: Path, repo_id: str, commit: str, dest: Path) -> list[str]:
    """Write commit ``commit`` (a full id) of repo ``repo_id`` under ``root`` into ``dest`` as a plain model
    folder: every file of its tree at its path, with its content (not an LFS pointer), as a snapshot download
    would leave it. ``dest`` is created if missing and files already there are replaced. Returns the paths
    written, sorted; an unknown commit raises ``FileNotFoundError``."""
    root, dest = Path(root), Path(dest)
    manifest = json.loads((repo_dir(root, repo_id) / "commits" / f"{commit}.json").read_text())
    paths = sorted(manifest["files"])
    for path in paths:
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / "objects" / manifest["files"][path]["sha256"], target)
    return paths


def _store(objects: Path, chunks: Iterable[bytes]) -> tuple[str, int]:
    """Write content to ``objects/<sha256>`` (atomically; kept when already there). Returns sha256 and size."""
    digest = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=objects, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
                size += len(chunk)
        final = objects / digest.hexdigest()
        if final.is_file() and final.stat().st_size == size:
            os.unlink(tmp)
        else:
            os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a hub running as another user must read it
            os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest.hexdigest(), size


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(json_bytes(obj))
    os.replace(tmp, path)


def _manifest(
    cid: str,
    *,
    tree: dict[str, str],
    parents: list[str],
    commit: Commit,
    files: dict[str, FileEntry],
    model_info: dict[str, Any],
) -> dict[str, Any]:
    """The per-commit record ``localcluster.hub`` serves from; ``trees`` maps directories to git tree ids."""
    title, _, body = commit.message.partition("\n\n")
    return {
        "format": MANIFEST_FORMAT,
        "id": cid,
        "parents": parents,
        "author": AUTHOR,
        "time": commit.when,
        "title": title,
        "message": body,
        "trees": tree,
        "files": {
            path: {
                "size": e.size,
                "sha256": e.sha256,
                "oid": e.git_blob_sha1,
                "lfs": {"oid": e.sha256, "size": e.size, "pointerSize": len(lfs_pointer(e.sha256, e.size))}
                if e.is_lfs
                else None,
            }
            for path, e in files.items()
        },
        "model_info": model_info,
    }


def _is_built(root: Path, repo_id: str, build: dict[str, Any]) -> RepoInfo | None:
    where = repo_dir(root, repo_id)
    try:
        data = json.loads((where / "info.json").read_text())
        if data.get("build") != build:
            return None
        info = load_info(root, repo_id)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (where / "refs.json").is_file():
        return None
    for cid, files in info.files.items():
        if not (where / "commits" / f"{cid}.json").is_file():
            return None
        for e in files.values():
            obj = Path(root) / "objects" / e.sha256
            if not obj.is_file() or obj.stat().st_size != e.size:
                return None
    return info


def write_repo(
    root: Path,
    repo_id: str,
    history: Sequence[Commit],
    *,
    branches: dict[str, str],
    tags: dict[str, str],
    build: dict[str, Any],
    model_info: dict[str, Any],
) -> RepoInfo:
    """Write repo ``repo_id`` under ``root``: ``history`` oldest first, each commit the child of the one before.

    ``branches`` and ``tags`` map ref names to commit names. ``build`` (JSON) names what the content was made
    from: when ``info.json`` records the same and every file is in place, nothing is written (no stream is
    read) and the recorded ``RepoInfo`` is returned. ``model_info`` is what the Hub adds to its model info
    (library, pipeline, tags).
    """
    root = Path(root)
    done = _is_built(root, repo_id, build)
    if done is not None:
        return done
    objects = root / "objects"
    objects.mkdir(parents=True, exist_ok=True)

    commits: dict[str, str] = {}
    all_files: dict[str, dict[str, FileEntry]] = {}
    parents: list[str] = []
    for commit in history:
        entries: dict[str, FileEntry] = {}
        for path, content in commit.files.items():
            if isinstance(content, bytes):
                sha256, size = _store(objects, [content])
                entries[path] = FileEntry(size, sha256, git_blob_sha1(content), False)
            else:
                sha256, size = _store(objects, content())
                entries[path] = FileEntry(size, sha256, git_blob_sha1(lfs_pointer(sha256, size)), True)
        trees = tree_ids({p: e.git_blob_sha1 for p, e in entries.items()})
        cid = commit_id(trees[""], parents, commit.when, commit.message)
        _write_json(
            repo_dir(root, repo_id) / "commits" / f"{cid}.json",
            _manifest(cid, tree=trees, parents=parents, commit=commit, files=entries, model_info=model_info),
        )
        commits[commit.name] = cid
        all_files[cid] = entries
        parents = [cid]

    branch_ids = {ref: commits[name] for ref, name in branches.items()}
    tag_ids = {ref: commits[name] for ref, name in tags.items()}
    _write_json(repo_dir(root, repo_id) / "refs.json", {"branches": branch_ids, "tags": tag_ids})
    info = RepoInfo(repo_id, commits, all_files, {**branch_ids, **tag_ids})
    # Written last: its presence (with objects present) is what marks the build complete.
    _write_json(repo_dir(root, repo_id) / "info.json", {**asdict(info), "build": build})
    return info


def write_v1_and_main(
    root: Path, repo_id: str, a: Commit, b: Commit, *, build: dict[str, Any], hub_tags: list[str]
) -> RepoInfo:
    """The history the cluster's models have: commit ``a`` (tag ``v1``), then its child ``b`` (branch
    ``main``), a transformers text-generation model with the Hub tags ``hub_tags``; see ``write_repo``."""
    return write_repo(
        root,
        repo_id,
        [a, b],
        branches={"main": b.name},
        tags={"v1": a.name},
        build=build,
        model_info={"library_name": "transformers", "pipeline_tag": "text-generation", "tags": hub_tags},
    )


def build_cli(build: Callable[[Path], RepoInfo], doc: str | None, argv: list[str] | None = None) -> None:
    """A repo module's CLI: ``build`` under ``--root`` and print ``{"repo_id", "commits", "refs"}`` as JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--root", required=True, type=Path)
    args = parser.parse_args(argv)
    info = build(args.root)
    print(json.dumps({"repo_id": info.repo_id, "commits": info.commits, "refs": info.refs}))
