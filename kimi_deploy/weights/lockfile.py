"""Lock files: every file of a pinned model revision with its size and digest.

``recipes/locks/<org>--<name>@<revision>.json``::

    {"repo": "org/name", "revision": "<40-hex>", "total_bytes": N,
     "files": {"model-00001-of-00096.safetensors": {"size": N, "digest": "sha256:<hex>"},
               "config.json": {"size": N, "digest": "gitblob:<hex>"}},
     "config": {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
                "tokenizer_remote_code": true}}

LFS files carry their sha256 (the Hub's LFS object id); small files carry git's blob id, which is
what the Hub publishes for them. Both are checked on the host after every download. ``config``
holds config.json's ``architectures`` and ``model_type`` at the revision, as the Hub shows them; a
lock without it (made before they were recorded, or of a revision with no config.json) is valid.
``tokenizer_remote_code``: whether its tokenizer is code of the checkpoint's own (an ``auto_map``
naming an ``AutoTokenizer`` in config.json or tokenizer_config.json, as the Hub shows them), which
the engine loads only with ``trust_remote_code``; ``kimi-deploy lock`` records it only where it is
true (absent: not needed, or a lock made before it was recorded). Every checkpoint a recipe
pins (the model, a speculative draft) has a lock of this format.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from kimi_deploy.errors import ConfigError
from kimi_deploy.hostside.boundary_names import BadName, check_name
from kimi_deploy.hostside.boundary_text import shown
from kimi_deploy.recipe import Checkpoint

LOCK_DIR = "recipes/locks"
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|gitblob:[0-9a-f]{40})$")
# config.json's names: an architecture is a Python class name, a model type a transformers key
_ARCHITECTURE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_MODEL_TYPE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


@dataclass(frozen=True)
class LockedFile:
    size: int
    digest: str


@dataclass(frozen=True)
class Lock:
    repo: str
    revision: str
    files: dict[str, LockedFile]
    # config.json's, at the revision (empty / None: not recorded)
    architectures: tuple[str, ...] = ()
    model_type: str | None = None
    # its tokenizer needs the checkpoint's own code (None: not recorded)
    tokenizer_remote_code: bool | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        data = {
            "repo": self.repo,
            "revision": self.revision,
            "total_bytes": self.total_bytes,
            "files": {p: {"size": f.size, "digest": f.digest} for p, f in sorted(self.files.items())},
        }
        config: dict[str, object] = {}
        if self.architectures:
            config["architectures"] = list(self.architectures)
        if self.model_type is not None:
            config["model_type"] = self.model_type
        if self.tokenizer_remote_code is not None:
            config["tokenizer_remote_code"] = self.tokenizer_remote_code
        if config:
            data["config"] = config
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def compact(self) -> dict[str, list[object]]:
        """``{path: [size, digest]}``: what the host-side programs read (a new mapping each time:
        a caller may change its own)."""
        return {p: [f.size, f.digest] for p, f in sorted(self.files.items())}


def lock_path(checkpoint: Checkpoint, base: Path | None = None) -> Path:
    name = f"{checkpoint.dir_name}@{checkpoint.revision}.json"
    return (base or Path(".")) / LOCK_DIR / name


def read_lock(checkpoint: Checkpoint, base: Path | None = None) -> Lock:
    """The lock of ``checkpoint``'s pinned revision (the recipe's model, a draft); ``ConfigError``
    when absent or malformed, or when a file name could leave the revision folder
    (``hostside.boundary_names.check_name``). Read once per process while the file is unchanged
    (its inode, size and mtime): a converge plans every host of the run against it."""
    path = lock_path(checkpoint, base)
    try:
        found = path.stat()
    except OSError:
        return _read_lock(checkpoint, path, None)
    return _read_lock(checkpoint, path, (found.st_ino, found.st_size, found.st_mtime_ns))


@functools.lru_cache(maxsize=32)
def _read_lock(checkpoint: Checkpoint, path: Path, stamp: tuple[int, int, int] | None) -> Lock:
    """``read_lock`` of ``path`` as it was at ``stamp`` (``None``: not found, which raises)."""
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            where,
            "",
            f"no lock for {checkpoint.repo}@{checkpoint.revision}: run `kimi-deploy lock RECIPE`",
        ) from None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(where, "", f"unreadable lock: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise ConfigError(where, "", f"expected a JSON object, found {shown(data)}")
    if data.get("repo") != checkpoint.repo or data.get("revision") != checkpoint.revision:
        raise ConfigError(where, "repo", f"lock is for {shown(data.get('repo'))}@{shown(data.get('revision'))}")
    entries = data.get("files") or {}
    if not isinstance(entries, dict):
        raise ConfigError(where, "files", f"expected a mapping of file names, found {shown(entries)}")
    files: dict[str, LockedFile] = {}
    for rel, entry in entries.items():
        try:
            # The hosts write and delete <revision folder>/<name> as root.
            check_name(rel)
        except BadName as exc:
            raise ConfigError(where, f"files.{exc.shown}", exc.rule) from None
        size, digest = (entry.get("size"), entry.get("digest")) if isinstance(entry, dict) else (None, None)
        if not isinstance(size, int) or size < 0 or not isinstance(digest, str) or not _DIGEST.match(digest):
            raise ConfigError(where, f"files.{rel}", f"expected size and sha256:/gitblob: digest, found {shown(entry)}")
        files[rel] = LockedFile(size, digest)
    if not files:
        raise ConfigError(where, "files", "lock names no file")
    architectures, model_type, remote = read_config(where, data.get("config", {}))
    return Lock(
        repo=data["repo"],
        revision=data["revision"],
        files=files,
        architectures=architectures,
        model_type=model_type,
        tokenizer_remote_code=remote,
    )


def read_config(where: str, config: object) -> tuple[tuple[str, ...], str | None, bool | None]:
    """The lock's ``config`` (config.json's ``architectures`` and ``model_type``, and whether the
    tokenizer needs remote code), each optional."""
    if not isinstance(config, dict):
        raise ConfigError(where, "config", f"expected a mapping, found {shown(config)}")
    unknown = sorted(set(config) - {"architectures", "model_type", "tokenizer_remote_code"})
    if unknown:
        raise ConfigError(where, f"config.{unknown[0]}", "unknown key")
    architectures = config.get("architectures", [])
    if not isinstance(architectures, list) or not all(
        isinstance(a, str) and _ARCHITECTURE.match(a) for a in architectures
    ):
        raise ConfigError(
            where, "config.architectures", f"expected a list of class names, found {shown(architectures)}"
        )
    model_type = config.get("model_type")
    if model_type is not None and not (isinstance(model_type, str) and _MODEL_TYPE.match(model_type)):
        raise ConfigError(where, "config.model_type", f"expected a model type name, found {shown(model_type)}")
    remote = config.get("tokenizer_remote_code")
    if remote is not None and not isinstance(remote, bool):
        raise ConfigError(where, "config.tokenizer_remote_code", f"expected true or false, found {shown(remote)}")
    return tuple(architectures), model_type, remote
